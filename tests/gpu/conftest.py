"""The GPU tests' shared fixture: the session's tiny Llama, on CUDA."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def model(tiny_model):
    return tiny_model.to("cuda")
