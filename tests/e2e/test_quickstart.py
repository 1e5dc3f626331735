"""The quickstart's folder layout and report fields stay what the README shows.

Runs the real `draftsmith quickstart` command on the embedded default, with the small budget
shrunk to toy sizes (the stages, their order and their options' names are the real ones), then
reruns it to check that finished stages are skipped.
"""

import json

import pytest
from typer.testing import CliRunner

from draftsmith.cli import app
from draftsmith.pipeline import quickstart

pytestmark = pytest.mark.slow

TOY = {
    "synth": {"limit": 2, "max_new_tokens": 12, "batch_size": 2},
    "magpie": {"magpie": 2, "max_new_tokens": 12, "batch_size": 2},
    "train": {"epochs": 1, "depth": 2, "batch_tokens": 512, "draft_vocab_size": 512, "val_fraction": 0.5},
    "eval": {"num_questions": 1, "max_new_tokens": 8, "depth_max": 2, "calibration_questions": 1},
}


@pytest.fixture
def toy_budget(monkeypatch):
    small = [(name, cmd, {**opts, **TOY.get(name, {})}) for name, cmd, opts in quickstart.SMALL]
    monkeypatch.setattr(quickstart, "SMALL", small)


def test_quickstart_layout_and_report_fields(tmp_path, toy_budget):
    out = tmp_path / "qs"
    r = CliRunner().invoke(app, ["quickstart", "--out", str(out), "--budget", "small"])
    assert r.exit_code == 0, r.output
    for rel in (
        "synth/conversations.jsonl",
        "synth/conversations.synth/progress.json",
        "prepare/data.parquet",
        "prepare/stats.json",
        "extract/store.json",
        "train/drafter/drafter.json",
        "train/drafter/model.safetensors",
        "train/metrics.jsonl",
        "train/metrics.png",
        "eval/report.json",
        "eval/report.md",
        "eval/answers.jsonl",
        "eval/acceptance.png",
        "eval/tau.png",
        ".pipeline/eval.done",
    ):
        assert (out / rel).exists(), rel
    report = json.loads((out / "eval" / "report.json").read_text())
    assert report["tau"] >= 1.0
    assert report["depth_requested"] == "auto" and len(report["accept_per_position"]) == report["shape"]["chosen_depth"]
    assert "speedup" in report
    assert "acceptance length tau" in r.output and "speed-up vs plain decoding" in r.output
    row = quickstart.accepted_per_position(report["accept_per_position"])  # the summary's row
    assert row.endswith(" of the cycles") and row in r.output
    val = json.loads((out / "train" / "drafter" / "drafter.json").read_text())["meta"]["val"]
    assert (
        f"simulated {val['tau']:.2f}, walked {val['tau_walk']:.2f}" in r.output
    )  # the validation that chose the drafter
    assert f"(a {report['shape']['chosen']} cycle costs" in r.output  # the break-even tau, from the calibration

    again = CliRunner().invoke(app, ["quickstart", "--out", str(out), "--budget", "small"])
    assert again.exit_code == 0, again.output
    assert again.output.count("done earlier, skipped") == len(quickstart.SMALL)
