"""The GPU tests' shared fixture: a CUDA copy of the session's tiny Llama."""

from __future__ import annotations

import copy

import pytest


@pytest.fixture(scope="module")
def model(tiny_model):
    # a copy: `.to` moves a module in place, and the session's tiny_model stays the CPU reference
    # of later tests (test_extract_gpu's fp32 forward failed after the eval tests had moved it)
    return copy.deepcopy(tiny_model).to("cuda")
