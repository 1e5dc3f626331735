"""`draftsmith eval --batch-size N`: rows that each decode their own question (multi-turn, the
last batch filled up), greedy answers equal to plain decoding's and to batch 1's, sampling at
temperature 1 with its own plain pass, and the batch size in the report; `--kernel-check`:
plain decoding through the verification forward's shape, against plain decoding; `--fuse-target`:
the target's projections fused, the same answers in float32."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from draftsmith.cli import app
from draftsmith.draft.checkpoint import save_drafter
from tests.helpers import random_drafter


@pytest.fixture
def setup(tiny_model, tiny_target_dir, tmp_path):
    drafter = save_drafter(random_drafter(tiny_model, draft_vocab_size=300), tmp_path / "drafter")
    questions = [
        {"turns": ["What is 2+2?", "And 3+3?"]},
        {"turns": ["Name a colour."]},
        {"turns": ["Say hi.", "Again."]},
        {"turns": ["Count to three."]},
    ]
    (tmp_path / "q.jsonl").write_text("\n".join(json.dumps(q) for q in questions) + "\n")
    return tiny_target_dir, drafter, tmp_path


def evaluate(setup, name: str, *options: str) -> dict:
    target, drafter, tmp = setup
    res = CliRunner().invoke(
        app,
        [
            "eval",
            "--target",
            str(target),
            "--drafter",
            str(drafter),
            "--bench",
            str(tmp / "q.jsonl"),
            "--max-new-tokens",
            "10",
            "--out",
            str(tmp / name),
            *options,
        ],
    )
    assert res.exit_code == 0, res.output
    answers = [json.loads(line) for line in (tmp / name / "answers.jsonl").read_text().splitlines()]
    return {"report": json.loads((tmp / name / "report.json").read_text()), "ids": [a["token_ids"] for a in answers]}


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["chain", "tree"])
def test_batches_answer_as_batch_one(setup, mode):
    shape = ["--mode", mode, "--depth", "3"] + (["--top-k", "2", "--total-tokens", "5"] if mode == "tree" else [])
    one = evaluate(setup, f"{mode}1", *shape)
    three = evaluate(setup, f"{mode}3", *shape, "--batch-size", "3", "--kernel-check")
    assert three["ids"] == one["ids"]
    r = three["report"]
    assert r["batch_size"] == 3 and one["report"]["batch_size"] == 1 and r["turns"] == 6
    assert r["greedy_turns_matching_plain"] == r["greedy_turns_checked"] == 6 and r["speedup"] is not None
    assert (
        r["verify_shape_turns_matching_plain"] == r["verify_shape_turns_checked"] == 6
    )  # fp32: that shape rounds alike
    assert one["report"]["verify_shape_turns_checked"] == 0  # only with --kernel-check


def test_fused_target_answers_as_the_unfused_one(setup):
    """--fuse-target (the GPU default; off on a CPU) fuses the engine's q/k/v and gate/up products:
    in float32 the same greedy answers, speculative and plain alike; the report and run.yaml say
    which engine ran."""
    unfused = evaluate(setup, "unfused", "--depth", "3", "--batch-size", "2")
    fused = evaluate(setup, "fused", "--depth", "3", "--batch-size", "2", "--fuse-target")
    assert fused["ids"] == unfused["ids"]
    assert fused["report"]["target_fused"] is True and unfused["report"]["target_fused"] is False
    assert fused["report"]["greedy_turns_matching_plain"] == fused["report"]["greedy_turns_checked"] == 6
    _, _, tmp = setup
    assert "fuse_target: true" in (tmp / "fused" / "run.yaml").read_text()
    assert "fuse_target: false" in (tmp / "unfused" / "run.yaml").read_text()  # the CPU default, resolved


@pytest.mark.slow
def test_temperature_one_batches_with_their_own_plain_pass(setup):
    r = evaluate(setup, "t1", "--temperature", "1", "--batch-size", "2")["report"]
    assert r["temperature"] == 1 and r["batch_size"] == 2 and r["plain_tok_per_s"] and r["speedup"] is not None
    assert r["greedy_turns_checked"] == 0  # sampled answers are not compared token for token


def test_generators_take_turns_a_batch_at_a_time(tiny_target_dir):
    """eval's passes (speculative, plain, plain through the verification shape) alternate a batch
    of questions at a time, each following its own earlier answers: a machine whose speed drifts
    during the run slows them alike."""
    from draftsmith.evaluate.decode import Turn
    from draftsmith.evaluate.questions import Question
    from draftsmith.evaluate.run import answer
    from draftsmith.target import load_tokenizer

    tok = load_tokenizer(str(tiny_target_dir))
    questions = [Question(i, "all", [f"question {i}", f"follow-up {i}"][: 1 + (i != 1)]) for i in range(3)]
    calls: list[tuple[str, int, list[bool]]] = []

    def generator(name: str, word: str):
        ids = tok.encode(f" {word}", add_special_tokens=False)

        def generate(prompts: list[list[int]]) -> list[Turn]:
            calls.append(
                (name, len(prompts), [tok.decode(p).count(word) == 1 for p in prompts])
            )  # its own answer, once
            return [Turn(ids, 0.0) for _ in prompts]

        return generate

    out = answer(tok, questions, [generator("spec", "apple"), generator("plain", "pear")], chunk=2)
    assert [(name, n) for name, n, _ in calls] == [
        ("spec", 2),
        ("plain", 2),
        ("spec", 1),
        ("plain", 1),  # first turns
        ("spec", 2),
        ("plain", 2),
    ]  # second turns: questions 0 and 2
    assert all(calls[i][2] == [False] * calls[i][1] for i in range(4))  # no answer yet in a first turn's history
    assert calls[4][2] == calls[5][2] == [True, True]  # each pass's second turns carry its own first answer
    assert [len(t) for t in out[0]] == [len(t) for t in out[1]] == [2, 1, 2]
