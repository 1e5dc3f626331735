"""bench/val_questions.py: the held-out split's first user turns, recovered from the tokens of
`prepare`'s dataset, are the very prompts the samples were made from (issue 17's held-out τ)."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from bench.val_questions import held_out_turns, spread
from draftsmith.cli import app
from draftsmith.target import load_tokenizer
from draftsmith.train.batching import split_indices

PROMPTS = [f"Question {i}: what is {i} plus {i}?\nThink  twice." for i in range(20)]  # newlines, double spaces


def test_held_out_first_turns_are_the_samples_prompts(tmp_path, tiny_target_dir):
    chats = tmp_path / "chats.jsonl"
    chats.write_text("".join(json.dumps({"messages": [
        {"role": "user", "content": p}, {"role": "assistant", "content": f"It is {2 * i}."},
        {"role": "user", "content": "And twice that?"}, {"role": "assistant", "content": f"{4 * i}."}]}) + "\n"
        for i, p in enumerate(PROMPTS)))
    res = CliRunner().invoke(app, ["prepare", str(chats), "--target", str(tiny_target_dir), "--out", str(tmp_path / "ds")])
    assert res.exit_code == 0, res.output
    questions, unmatched = held_out_turns(tmp_path / "ds", load_tokenizer(str(tiny_target_dir)), val_fraction=0.25, val_seed=3)
    _, val_idx = split_indices(len(PROMPTS), 0.25, 3)
    assert unmatched == 0
    assert [q["turns"] for q in questions] == [[PROMPTS[i]] for i in val_idx]  # train's split, the first turns only


def test_spread_samples_every_part_of_the_split():
    questions = [{"question_id": i} for i in range(100)]  # e.g. 0-29 GSM8K, then Magpie
    picked = [q["question_id"] for q in spread(questions, 10)]
    assert picked == list(range(0, 100, 10))
    assert spread(questions[:5], 10) == questions[:5]
