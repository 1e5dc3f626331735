"""`draftsmith eval --compare` on CUDA (run with --run-gpu): EAGLE-3, P-EAGLE and DFlash drafters
side by side on one graphed, compiled engine answer as each does alone on its own engine, and
each drafter's greedy answers equal plain decoding through the verification's shape."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from draftsmith.cli import app
from draftsmith.draft.checkpoint import save_drafter
from tests.helpers import random_dflash, random_drafter

pytestmark = pytest.mark.gpu

QUESTIONS = [{"turns": ["What is 2+2?", "And 3+3?"]}, {"turns": ["Name a colour."]}, {"turns": ["Say hi."]}]


def test_side_by_side_on_cuda_answers_as_each_alone(tiny_model, tiny_target_dir, tmp_path):
    drafters = [
        save_drafter(random_drafter(tiny_model, draft_vocab_size=300), tmp_path / "eagle"),
        save_drafter(random_drafter(tiny_model, draft_vocab_size=300, seed=1, method="peagle"), tmp_path / "pe"),
        save_drafter(random_dflash(tiny_model), tmp_path / "df"),
    ]
    (tmp_path / "q.jsonl").write_text("\n".join(json.dumps(q) for q in QUESTIONS) + "\n")

    def evaluate(out: str, *options: str) -> None:
        common = ["--target", str(tiny_target_dir), "--bench", str(tmp_path / "q.jsonl"), "--depth", "3"]
        res = CliRunner().invoke(
            app,
            ["eval", *common, "--max-new-tokens", "24", "--batch-size", "2", "--out", str(tmp_path / out), *options],
        )
        assert res.exit_code == 0, res.output

    def answers(folder) -> list[list[int]]:
        return [json.loads(line)["token_ids"] for line in (folder / "answers.jsonl").read_text().splitlines()]

    evaluate("side", "--drafter", str(drafters[0]), "--compare", f"{drafters[1]},{drafters[2]}", "--kernel-check")
    compare = json.loads((tmp_path / "side" / "compare.json").read_text())
    assert [d["method"] for d in compare["drafters"]] == ["eagle3", "peagle", "dflash"]
    for path, d in zip(drafters, compare["drafters"], strict=True):
        folder = tmp_path / "side" / d["report"].removesuffix("report.json")
        report = json.loads((folder / "report.json").read_text())
        assert report["cuda_graphs"] and report["drafter_graphed"]
        assert report["verify_shape_turns_matching_plain"] == report["verify_shape_turns_checked"] == 4
        evaluate(f"alone-{d['name']}", "--drafter", str(path))
        assert answers(folder) == answers(tmp_path / f"alone-{d['name']}")
