"""`--shard auto` (a target split over the visible GPUs, issue 18 item 4), what a CPU can check:
the refusals, the placement check on a model whose device map offloads part of it, and the load
path through transformers' device_map. The split itself runs in tests/gpu/test_shard_gpu.py."""

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


def test_offloading_is_refused() -> None:
    model = make_tiny_llama(300)
    model.hf_device_map = {"model.embed_tokens": 0, "model.layers.0": 0, "model.layers.1": "cpu", "lm_head": "disk"}
    with pytest.raises(
        UserError, match="does not fit on the .* visible GPUs: --shard auto would put part of it on the cpu and disk"
    ):
        placement(model, "tiny")


def test_capture_returns_on_the_inputs_device() -> None:
    model = make_tiny_llama(300)
    ids = torch.randint(3, 300, (2, 9))
    aux, final = capture(model, ids, torch.ones_like(ids), [0, 1, 2])
    assert aux.shape == (2, 9, 3 * 64) and final.shape == (2, 9, 64) and aux.device == final.device == ids.device


def test_loading_split_goes_through_device_map(monkeypatch: pytest.MonkeyPatch, tiny_target_dir) -> None:
    """The real load path of --shard auto: on a machine without GPUs device_map="auto" can only
    place the model on the CPU, which the placement check refuses, naming it."""
    from draftsmith.target import load_target

    monkeypatch.setattr("draftsmith.target.check_shard", lambda shard: None)
    with pytest.raises(
        UserError, match="does not fit on the 0 visible GPUs: --shard auto would put part of it on the cpu"
    ):
        load_target(str(tiny_target_dir), device="cpu", shard="auto")
