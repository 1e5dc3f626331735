"""`eval` drafts no deeper than the drafter was trained for (drafter.json's meta `depth`, from
`train --depth`): a deeper --depth, tree or --depth-max is refused before anything is written,
naming the trained depth; --depth auto tries only the depths within it; a drafter whose record
does not say (a third-party one) is not bounded."""

from __future__ import annotations

import json
import shutil

import pytest
from typer.testing import CliRunner

from draftsmith.cli import app
from draftsmith.draft.checkpoint import save_drafter
from draftsmith.draft.methods import deepest, trained_depth
from tests.helpers import eval_cli, random_drafter


@pytest.fixture
def trained_two(tiny_model, tiny_target, tiny_target_dir, tmp_path):
    drafter = save_drafter(
        random_drafter(tiny_model, draft_vocab_size=300),
        tmp_path / "drafter",
        target=tiny_target.info.to_dict(),
        meta={"depth": 2},
    )
    return tiny_target_dir, drafter, tmp_path


@pytest.mark.parametrize(
    "options, flag",
    [
        (["--depth", "3"], "--depth 3"),
        (["--mode", "tree", "--depth", "4", "--top-k", "2", "--total-tokens", "5"], "--depth 4"),
        (["--depth", "auto", "--depth-max", "5"], "--depth-max 5"),
    ],
)
def test_a_draft_deeper_than_trained_is_refused_naming_the_trained_depth(trained_two, options, flag):
    res = eval_cli(trained_two, *options)
    text = " ".join(res.output.split())
    assert res.exit_code != 0 and f"{flag}: this EAGLE-3 drafter was trained to draft 2 deep" in text, res.output
    assert "train --depth 2" in text
    assert not (trained_two[2] / "e").exists()


def test_depth_auto_tries_only_the_trained_depths(trained_two):
    res = eval_cli(trained_two, "--depth", "auto", "--calibration-questions", "1")
    assert res.exit_code == 0, res.output
    shape = json.loads((trained_two[2] / "e" / "report.json").read_text())["shape"]
    assert [c["depth"] for c in shape["candidates"]] == [1, 2]


def test_the_trained_depth_comes_from_the_record():
    assert trained_depth({"meta": {"depth": 7}}) == 7
    assert trained_depth({"meta": {"ttt": 5}}) == 5  # a record of before --ttt was named --depth
    assert trained_depth({"meta": {}}) is None and trained_depth({}) is None
    assert trained_depth({"meta": {"depth": True}}) is None and trained_depth({"meta": {"depth": "7"}}) is None


def test_the_bound_is_the_lower_of_the_method_limit_and_the_trained_depth(tiny_model):
    cfg = random_drafter(tiny_model, draft_vocab_size=300).config
    assert deepest(cfg, None) is None and deepest(cfg, 4) == 4


def test_depth_auto_reaches_as_deep_as_the_drafter_was_trained(tiny_model, tiny_target_dir, tmp_path):
    """Without --depth-max, --depth auto tries every chain up to the trained depth (a drafter
    trained deeper than 7 gets its deeper chains tried)."""
    drafter = save_drafter(random_drafter(tiny_model, draft_vocab_size=300), tmp_path / "drafter", meta={"depth": 9})
    res = eval_cli((tiny_target_dir, drafter, tmp_path), "--depth", "auto", "--calibration-questions", "1")
    assert res.exit_code == 0, res.output
    shape = json.loads((tmp_path / "e" / "report.json").read_text())["shape"]
    assert [c["depth"] for c in shape["candidates"]] == list(range(1, 10))


def test_tree_auto_tries_a_deeper_trained_drafters_own_depth(tiny_model, tiny_target_dir, tmp_path):
    """--tree auto without --tree-shapes tries the default shapes and, for a drafter trained
    deeper than their deepest (7), one tree at its trained depth: 90x9x10 for depth 9. Given
    shapes are taken as they are."""
    drafter = save_drafter(random_drafter(tiny_model, draft_vocab_size=300), tmp_path / "drafter", meta={"depth": 9})
    setup = (tiny_target_dir, drafter, tmp_path)
    res = eval_cli(setup, "--tree", "auto", "--calibration-questions", "1")
    assert res.exit_code == 0, res.output
    shape = json.loads((tmp_path / "e" / "report.json").read_text())["shape"]
    assert [c["shape"] for c in shape["candidates"]] == ["8x4x2", "16x5x4", "32x6x8", "60x7x10", "90x9x10"]
    res = eval_cli(
        setup, "--tree", "auto", "--tree-shapes", "8x4x2,60x7x10", "--calibration-questions", "1", "--overwrite"
    )
    assert res.exit_code == 0, res.output
    shape = json.loads((tmp_path / "e" / "report.json").read_text())["shape"]
    assert [c["shape"] for c in shape["candidates"]] == ["8x4x2", "60x7x10"]


def test_tree_auto_on_a_drafter_trained_shallower_than_every_shape(trained_two):
    """--tree auto replaces --depth (whose default, 7, is past this drafter's 2): no refusal, and
    where every default shape is deeper than the trained depth, the tree at that depth (20x2x10)."""
    res = eval_cli(trained_two, "--tree", "auto", "--calibration-questions", "1")
    assert res.exit_code == 0, res.output
    report = json.loads((trained_two[2] / "e" / "report.json").read_text())
    assert [c["shape"] for c in report["shape"]["candidates"]] == ["20x2x10"]
    assert report["mode"] == "tree" and report["depth"] == 2


def test_export_refuses_a_depth_beyond_the_trained_one(trained_two, tmp_path):
    _, drafter, _ = trained_two
    res = CliRunner().invoke(app, ["export", str(drafter), "--out", str(tmp_path / "x"), "--depth", "3"])
    text = " ".join(res.output.split())
    assert res.exit_code != 0 and "--depth 3: this EAGLE-3 drafter was trained to draft 2 deep" in text, res.output
    assert not (tmp_path / "x").exists()
    res = CliRunner().invoke(app, ["export", str(drafter), "--out", str(tmp_path / "ok"), "--depth", "2"])
    assert res.exit_code == 0, res.output


def test_a_tree_whose_verification_would_not_fit_is_refused_before_decoding(trained_two, monkeypatch):
    """A tree of 2 levels of 200 children keeping 2,000 nodes verifies 2,001 tokens a cycle (about
    1.2 GB of float32 logits over the 49k vocab): with 600 MB free (enough for the tiny target
    itself), eval stops before the engine allocates, naming what to lower, and writes nothing."""
    monkeypatch.setattr("draftsmith.memory.available_memory", lambda device: 600 << 20)
    res = eval_cli(trained_two, "--mode", "tree", "--depth", "2", "--top-k", "200", "--total-tokens", "2000")
    text = " ".join(res.output.split())
    assert res.exit_code != 0 and "verifications of 2001 tokens" in text and "lower --total-tokens or --top-k" in text
    assert not (trained_two[2] / "e").exists()


def test_a_drafter_trained_twelve_deep_drafts_twelve_deep_losslessly(tiny_target_dir, tmp_path):
    """Deeper drafting end to end: `train --depth 12` (TTT's unroll of 12 steps) records it, and
    eval drafts chains and trees 12 deep from it, greedy answers token for token plain decoding's."""
    import numpy as np

    from tests.helpers import write_tokenized_dataset

    g = np.random.default_rng(0)
    ds = write_tokenized_dataset(tmp_path / "ds", [g.integers(3, 400, size=40).tolist() for _ in range(6)])
    train = [
        "train", str(ds), "--target", str(tiny_target_dir), "--out", str(tmp_path / "run"), "--steps", "2",
        "--depth", "12", "--batch-tokens", "96", "--draft-vocab-size", "300", "--val-fraction", "0", "--device", "cpu",
    ]  # fmt: skip
    res = CliRunner().invoke(app, train)
    assert res.exit_code == 0, res.output
    (tmp_path / "q.jsonl").write_text(json.dumps({"turns": ["Count to ten."]}) + "\n")
    for mode in (["--mode", "chain"], ["--mode", "tree", "--top-k", "2", "--total-tokens", "16"]):
        res = eval_cli((tiny_target_dir, tmp_path / "run", tmp_path), "--depth", "12", *mode, "--max-new-tokens", "24")
        assert res.exit_code == 0, res.output
        report = json.loads((tmp_path / "e" / "report.json").read_text())
        assert report["depth"] == 12 and report["greedy_turns_matching_plain"] == report["turns"] == 1
        shutil.rmtree(tmp_path / "e")
