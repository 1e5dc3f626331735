"""`--shard auto` (a target split over the visible GPUs, issue 18 item 4), what a CPU can check:
the refusals, and the placement check on a model whose device map offloads part of it. The
split itself runs in tests/gpu/test_shard_gpu.py."""

from __future__ import annotations

import pytest
import torch

from draftsmith.errors import UserError
from draftsmith.runtime.capture import capture
from draftsmith.target import check_shard, placement
from tests.helpers import make_tiny_llama


def test_no_gpu_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(UserError, match="no CUDA GPU is visible; use --shard none"):
        check_shard("auto")
    check_shard("none")


def test_torchrun_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(UserError, match="run the command without torchrun"):
        check_shard("auto")


def test_offloading_is_refused_and_a_split_is_reported(capsys: pytest.CaptureFixture[str]) -> None:
    model = make_tiny_llama(300)
    model.hf_device_map = {"model.embed_tokens": 0, "model.layers.0": 0, "model.layers.1": "cpu", "lm_head": "disk"}
    with pytest.raises(UserError, match="does not fit on the .* visible GPUs: --shard auto would put part of it on the cpu and disk"):
        placement(model, "tiny")
    model.hf_device_map = {"": 0}
    assert placement(model, "tiny") == torch.device("cpu")  # the input embedding's device
    assert "tiny split over 1 GPU(s): layers 0-1 on cpu" in capsys.readouterr().err


def test_capture_returns_on_the_inputs_device() -> None:
    model = make_tiny_llama(300)
    ids = torch.randint(3, 300, (2, 9))
    aux, final = capture(model, ids, torch.ones_like(ids), [0, 1, 2])
    assert aux.shape == (2, 9, 3 * 64) and final.shape == (2, 9, 64) and aux.device == final.device == ids.device
