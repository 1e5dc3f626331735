"""`draftsmith eval` on the embedded default (SmolLM2-135M) with a random drafter:
greedy speculative output equals the target's own greedy output, chain and tree, on 10
MT-bench prompts; the CLI writes a complete report."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from draftsmith.draft.checkpoint import save_drafter
from draftsmith.evaluate.decode import plain_generate, spec_generate
from draftsmith.evaluate.proposer import DrafterProposer
from draftsmith.evaluate.questions import load_questions, turn_prompt
from draftsmith.runtime.engine import TargetEngine
from draftsmith.runtime.sampling import Sampling
from tests.helpers import random_drafter

pytestmark = pytest.mark.slow

N_PROMPTS, NEW = 10, 20


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Two-thread matmuls of a few rows crawl on a shared 2-core machine; one thread is faster."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def setup(smollm2):
    drafter = random_drafter(smollm2.model, draft_vocab_size=8192)
    engine = TargetEngine(smollm2.model, drafter.config.aux_layer_ids, max_len=256)
    prompts = [turn_prompt(smollm2.tokenizer, q.turns[:1], []) for q in load_questions("mt_bench", N_PROMPTS)]
    plain = [plain_generate(engine, p, NEW, set(), Sampling()).tokens for p in prompts]
    return drafter, engine, prompts, plain


def test_plain_engine_equals_hf_generate(smollm2, setup):
    _, _, prompts, plain = setup
    for p, ours in zip(prompts[:2], plain[:2], strict=True):
        ref = smollm2.model.generate(
            torch.tensor([p]),
            do_sample=False,
            max_new_tokens=NEW,
            min_new_tokens=NEW,
            eos_token_id=None,
            pad_token_id=0,
        )[0, len(p) :].tolist()
        assert ours == ref


@pytest.mark.parametrize("mode", ["chain", "tree"])
def test_greedy_speculative_equals_target_greedy(setup, mode):
    drafter, engine, prompts, plain = setup
    proposer = DrafterProposer(drafter, Sampling(), engine.max_len, mode=mode, depth=3, top_k=4, total_tokens=10)
    steps = []
    for p, ref in zip(prompts, plain, strict=True):
        out = spec_generate(engine, proposer, p, NEW, set(), Sampling())
        assert out.tokens == ref  # token for token
        steps += out.accepts
    tau = sum(a + 1 for a in steps) / len(steps)
    assert tau < 1.2  # a random drafter is almost never right


def test_cli_eval_writes_report(smollm2, tmp_path, monkeypatch):
    drafter_dir = save_drafter(random_drafter(smollm2.model, draft_vocab_size=8192), tmp_path / "drafter")
    bench = tmp_path / "q.jsonl"
    bench.write_text(
        json.dumps({"question_id": "a", "category": "math", "turns": ["What is 2+2?", "And 3+3?"]})
        + "\n"
        + json.dumps({"id": "b", "prompt": "Name a colour."})
        + "\n"
    )
    monkeypatch.setattr("draftsmith.evaluate.run.load_target", lambda *a, **k: smollm2)  # loaded once per session
    from draftsmith.cli import app

    out = tmp_path / "eval"
    res = CliRunner().invoke(
        app,
        [
            "eval",
            "--drafter",
            str(drafter_dir),
            "--out",
            str(out),
            "--bench",
            str(bench),
            "--mode",
            "tree",
            "--depth",
            "3",
            "--top-k",
            "3",
            "--total-tokens",
            "8",
            "--max-new-tokens",
            "12",
        ],
    )
    assert res.exit_code == 0, res.output
    assert "eval: tau" in res.output
    report = json.loads((out / "report.json").read_text())
    assert report["turns"] == 3 and report["greedy_turns_matching_plain"] == 3
    assert 1.0 <= report["tau"] < 1.5 and report["speedup"] is not None and len(report["accept_per_position"]) == 3
    assert set(report["categories"]) == {"math", "all"}
    answers = [json.loads(line) for line in (out / "answers.jsonl").read_text().splitlines()]
    assert [a["question_id"] for a in answers] == ["a", "b"] and len(answers[0]["token_ids"]) == 2
    assert sum(map(len, answers[0]["accepts"])) > 0
    for name in ("report.md", "acceptance.png", "tau.png", "run.yaml"):
        assert (out / name).stat().st_size > 0


def test_cli_eval_bad_bench_is_a_user_error(tmp_path):
    from draftsmith.cli import app

    (tmp_path / "bad.jsonl").write_text('{"nothing": 1}\n')
    res = CliRunner().invoke(
        app, ["eval", "--drafter", str(tmp_path), "--out", str(tmp_path / "o"), "--bench", str(tmp_path / "bad.jsonl")]
    )
    assert res.exit_code == 2
    assert "bad.jsonl:1" in res.output
    assert not (tmp_path / "o").exists()
