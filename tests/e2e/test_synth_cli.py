"""`draftsmith synth` end to end on the embedded default (SmolLM2-135M, CPU): greedy answers
of the static-KV engine generator (what GPU runs use) equal the target's own `generate`, the
output loads in `prepare`, and Magpie self-prompts (through HF `generate`, the CPU default)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from draftsmith.assets import GSM8K_TRAIN
from draftsmith.cli import app

pytestmark = pytest.mark.slow


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_gsm8k_greedy_equals_generate_and_loads_in_prepare(tmp_path, smollm2):
    prompts = tmp_path / "gsm8k4.jsonl"
    prompts.write_text("".join(GSM8K_TRAIN.read_text().splitlines(keepends=True)[:4]))
    out = tmp_path / "synth" / "conversations.jsonl"
    res = CliRunner().invoke(
        app,
        [
            "synth",
            str(prompts),
            "--out",
            str(out),
            "--max-new-tokens",
            "32",
            "--temperature",
            "0",
            "--batch-size",
            "4",
            "--keep-unfinished",
            "--device",
            "cpu",
            "--generator",
            "engine",
        ],
    )
    assert res.exit_code == 0, res.output
    records = _lines(out)
    assert sorted(r["id"] for r in records) == [f"gsm8k4:line-{i}:s0" for i in range(1, 5)]

    tok, model = smollm2.tokenizer, smollm2.model
    for rec in records:
        user, answer = rec["messages"]
        assert user["role"] == "user" and answer["role"] == "assistant" and answer["content"].strip()
        assert rec["model"] == "smollm2-135m" and rec["generation"]["temperature"] == 0.0
        ids = tok(
            tok.apply_chat_template([user], tokenize=False, add_generation_prompt=True),
            add_special_tokens=False,
            return_tensors="pt",
        )["input_ids"]
        with torch.inference_mode():
            ref = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=32, do_sample=False)
        assert answer["content"] == tok.decode(ref[0, ids.shape[1] :], skip_special_tokens=True), rec["id"]

    prepared = tmp_path / "prepared"
    res = CliRunner().invoke(app, ["prepare", str(out), "--out", str(prepared), "--format", "messages"])
    assert res.exit_code == 0, res.output
    stats = json.loads((prepared / "stats.json").read_text())
    assert stats["samples_kept"] == 4 and stats["assistant_tokens"] > 4 * 16


def test_magpie_self_prompts(tmp_path, smollm2, monkeypatch):
    # the CLI would load the same target again; reuse the session's copy to keep the test short
    monkeypatch.setattr("draftsmith.target.load_target", lambda *a, **k: smollm2)
    out = tmp_path / "magpie" / "conversations.jsonl"
    res = CliRunner().invoke(
        app,
        [
            "synth",
            "--magpie",
            "4",
            "--out",
            str(out),
            "--max-new-tokens",
            "32",
            "--keep-unfinished",
            "--seed",
            "1",
            "--batch-size",
            "4",
        ],
    )
    assert res.exit_code == 0, res.output
    records = _lines(out)
    good = [
        r
        for r in records
        if [m["role"] for m in r["messages"]] == ["user", "assistant"]
        and all(m["content"].strip() for m in r["messages"])
    ]
    assert len(good) >= 3, records
    assert len({r["messages"][0]["content"] for r in good}) == len(good)  # distinct self-prompts
    assert all(r["id"].startswith("magpie:") and r["generation"]["magpie"]["temperature"] == 1.0 for r in records)
