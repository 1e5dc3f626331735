"""`--depth auto` / `--tree auto`: the draft shape with the best predicted speed, from acceptance and
measured cycle costs. The arithmetic on hand-made numbers, the calibration on the tiny Llama with
a perfect and a useless proposer, and the CLI's report."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from typer.testing import CliRunner

from draftsmith.cli import app
from draftsmith.draft.checkpoint import save_drafter
from draftsmith.errors import UserError
from draftsmith.evaluate.decode import plain_generate
from draftsmith.evaluate.proposer import DrafterProposer, OracleProposer
from draftsmith.evaluate.shape import (
    Calibration,
    Candidate,
    Shape,
    calibrate,
    conditional_acceptance,
    expected_tokens,
    spread,
    summary,
)
from draftsmith.layers import default_aux_layers
from draftsmith.runtime.engine import TargetEngine
from draftsmith.runtime.sampling import Sampling
from tests.helpers import random_drafter


def test_conditional_acceptance_counts_cycles_that_got_that_far():
    assert conditional_acceptance([0, 1, 3, 3, 2], 3) == pytest.approx([4 / 5, 3 / 4, 2 / 3])
    assert conditional_acceptance([0, 0], 2) == [0.0, 0.0]  # nothing reached position 2: 0, not a division by 0


def chain_calibration(accept_cond: list[float]) -> Calibration:
    cands = [
        Candidate(Shape(k), expected_tokens(accept_cond, k), 1 + k / 10) for k in (1, 2, 3, 4)
    ]  # 1.1 .. 1.4 s a cycle
    return Calibration("chain", cands, plain_seconds=1.0, tokens=100, accept_cond=accept_cond)


def test_best_k_trades_acceptance_against_cycle_cost():
    cal = chain_calibration([0.9, 0.9, 0.9, 0.1])
    assert expected_tokens(cal.accept_cond, 2) == pytest.approx(1 + 0.9 + 0.81)
    assert cal.best().shape == Shape(3)  # the 4th position is accepted too rarely to pay for its cost
    useless = chain_calibration([0.0] * 4)
    assert useless.best().shape == Shape(1) and useless.predicted_speedup(useless.best()) < 1
    assert (
        "a K=1 cycle costs 1.10 plain tokens here, so it pays from tau 1.10 on, and this drafter's expected tau is 1.00"
        in summary(useless)
    )  # why no shape was chosen to pay
    assert "predicted to beat" not in summary(cal)
    assert useless.to_dict()["break_even_tau"] == pytest.approx(1.1)  # what the quickstart's table shows
    d = cal.to_dict()
    assert d["chosen_depth"] == 3 and d["chosen"] == "K=3" and [c["depth"] for c in d["candidates"]] == [1, 2, 3, 4]


def test_calibration_questions_spread_over_the_run():
    assert spread(80, 2) == [20, 60] and spread(80, 8) == [5, 15, 25, 35, 45, 55, 65, 75]  # one per category of 10
    assert spread(3, 2) == [0, 2] and spread(2, 5) == [0, 1] and spread(7, 1) == [3]
    for n, m in [(80, 3), (11, 4), (5, 5)]:
        picks = spread(n, m)
        assert len(set(picks)) == min(n, m) and picks == sorted(picks) and 0 <= picks[0] and picks[-1] < n


def test_tree_shapes_parse_and_compare():
    assert Shape.parse_tree("60x7x10") == Shape(7, 10, 60) and Shape(7, 10, 60).label == "60x7x10"
    for bad in ("60x7", "60,7,10", "0x7x10"):
        with pytest.raises(UserError, match="tree shape"):
            Shape.parse_tree(bad)
    with pytest.raises(UserError, match="drafts 14 nodes to choose from, fewer than 15"):
        Shape.parse_tree("15x4x2")  # 2 at the first level, then 2 x 2 at each of the other 3
    assert Shape.parse_tree("14x4x2") == Shape(4, 2, 14)
    small, big = Candidate(Shape(4, 2, 8), 2.0, 1.0), Candidate(Shape(7, 10, 60), 3.0, 1.6)
    cal = Calibration("tree", [small, big], plain_seconds=0.8, tokens=50)
    assert cal.best() is small and cal.predicted_speedup(big) == pytest.approx(
        1.5
    )  # 3 tokens in 1.6 s vs 0.8 s a token
    assert cal.to_dict()["chosen_shape"] == {"depth": 4, "top_k": 2, "total_tokens": 8, "stop_below": None}


@pytest.mark.slow
def test_calibration_on_the_engine(tiny_model):
    model = tiny_model
    engine = TargetEngine(model, default_aux_layers(2), max_len=128)
    prompt = torch.randint(3, 300, (9,), generator=torch.Generator().manual_seed(0)).tolist()
    reference = prompt + plain_generate(engine, prompt, 40, set(), Sampling()).tokens
    chains = [Shape(k) for k in (4, 3, 2, 1)]
    oracle = calibrate(
        engine, lambda s: OracleProposer(reference, depth=s.depth), [prompt], 24, set(), Sampling, chains
    )
    assert oracle.accept_cond == [1.0] * 4 and oracle.tokens == 24
    assert [c.shape.depth for c in oracle.candidates] == [1, 2, 3, 4] and oracle.candidates[-1].expected_tokens == 5
    drafter = random_drafter(model, draft_vocab_size=300)
    useless = calibrate(
        engine,
        lambda s: DrafterProposer(drafter, Sampling(), 128, depth=s.depth),
        [prompt],
        24,
        set(),
        Sampling,
        [Shape(4), Shape(1)],
    )
    assert useless.accept_cond[0] < 0.5 and useless.candidates[-1].expected_tokens < 1.5  # a draft rarely right
    # so the cheapest cycle wins: the shortest chain wherever a cycle costs more with K (given here, not
    # timed: on a loaded 2-core CPU the two cycles' times have crossed)
    growing = replace(useless, candidates=[replace(c, cycle_seconds=1.0 + c.shape.depth) for c in useless.candidates])
    assert growing.best().shape == Shape(1)
    trees = [Shape(2, 2, 3), Shape(4, 1, 4)]  # the oracle's tree: each true node with a wrong sibling
    tree = calibrate(
        engine,
        lambda s: OracleProposer(reference, mode="tree", depth=s.depth, vocab_size=300),
        [prompt],
        24,
        set(),
        Sampling,
        trees,
    )
    assert tree.mode == "tree" and tree.accept_cond is None and tree.tokens == 48  # 24 tokens by each shape
    assert [c.expected_tokens for c in tree.candidates] == pytest.approx([3, 5], abs=0.4)


def test_shapes_and_plain_take_turns_a_batch_at_a_time(monkeypatch):
    """The calibration decodes each batch of prompts with every shape and then plainly before the
    next batch, so that a drift in the machine's speed slows them alike."""
    import types

    from draftsmith.evaluate import shape as shape_module
    from draftsmith.evaluate.decode import Turn

    calls = []

    def fake_decode_all(engine, prompts, max_new, stops, sampling, proposer=None):
        calls.append((proposer, [p[0] for p in prompts]))
        return [Turn([1, 2, 3], 0.3, [1, 0]) for _ in prompts]

    monkeypatch.setattr(shape_module, "decode_all", fake_decode_all)
    engine = types.SimpleNamespace(batch=2)
    cal = calibrate(engine, lambda s: f"K={s.depth}", [[10], [11], [12]], 8, set(), Sampling, [Shape(2), Shape(1)])
    assert calls == [("K=2", [10, 11]), ("K=1", [10, 11]), (None, [10, 11]), ("K=2", [12]), ("K=1", [12]), (None, [12])]
    assert cal.plain_seconds == pytest.approx(0.3 * 3 / (2 * 3)) and cal.accept_cond == [0.5, 0.0]


@pytest.mark.slow
def test_cli_k_auto_reports_its_choice(tiny_model, tiny_target_dir, tmp_path):
    drafter = save_drafter(random_drafter(tiny_model, draft_vocab_size=300), tmp_path / "drafter")
    (tmp_path / "q.jsonl").write_text(
        "\n".join(json.dumps({"turns": [t]}) for t in ("What is 2+2?", "Name a colour.")) + "\n"
    )
    res = CliRunner().invoke(
        app,
        [
            "eval",
            "--target",
            str(tiny_target_dir),
            "--drafter",
            str(drafter),
            "--bench",
            str(tmp_path / "q.jsonl"),
            "--depth",
            "auto",
            "--depth-max",
            "3",
            "--max-new-tokens",
            "12",
            "--calibration-questions",
            "1",
            "--out",
            str(tmp_path / "eval"),
        ],
    )
    assert res.exit_code == 0, res.output
    assert "--depth auto chose K=" in res.output and "graphs ready" not in res.output  # none on a CPU
    report = json.loads((tmp_path / "eval" / "report.json").read_text())
    shape = report["shape"]
    assert report["depth_requested"] == "auto" and report["depth"] == shape["chosen_depth"] in (1, 2, 3)
    assert shape["questions"] == [1]  # the middle of the two questions
    assert len(report["accept_per_position"]) == report["depth"] and len(shape["candidates"]) == 3
    assert report["greedy_turns_matching_plain"] == report["turns"]
    md = (tmp_path / "eval" / "report.md").read_text()
    assert "`--depth auto` chose" in md and "the calibration reads first turns only" in md
    tree = CliRunner().invoke(
        app,
        [
            "eval",
            "--target",
            str(tiny_target_dir),
            "--drafter",
            str(drafter),
            "--depth",
            "auto",
            "--mode",
            "tree",
            "--out",
            str(tmp_path / "tree"),
        ],
    )
    assert tree.exit_code == 2 and "--tree auto" in tree.output


@pytest.mark.slow
def test_cli_tree_auto_reports_its_choice(tiny_model, tiny_target_dir, tmp_path):
    drafter = save_drafter(random_drafter(tiny_model, draft_vocab_size=300), tmp_path / "drafter")
    (tmp_path / "q.jsonl").write_text(json.dumps({"turns": ["What is 2+2?"]}) + "\n")
    res = CliRunner().invoke(
        app,
        [
            "eval",
            "--target",
            str(tiny_target_dir),
            "--drafter",
            str(drafter),
            "--bench",
            str(tmp_path / "q.jsonl"),
            "--tree",
            "auto",
            "--tree-shapes",
            "4x2x2,6x3x3",
            "--max-new-tokens",
            "10",
            "--out",
            str(tmp_path / "eval"),
        ],
    )
    assert res.exit_code == 0, res.output
    assert "--tree auto chose " in res.output
    report = json.loads((tmp_path / "eval" / "report.json").read_text())
    shape = report["shape"]
    assert report["mode"] == "tree" and shape["chosen"] in ("4x2x2", "6x3x3") and len(shape["candidates"]) == 2
    assert (report["total_tokens"], report["depth"], report["top_k"]) == tuple(
        shape["chosen_shape"][k] for k in ("total_tokens", "depth", "top_k")
    )
    assert report["greedy_turns_matching_plain"] == report["turns"]
    assert report["tree_topk"] == "torch"  # the fused Triton kernels: CUDA's
    assert "`--tree auto` chose" in (tmp_path / "eval" / "report.md").read_text()
    bad = CliRunner().invoke(
        app,
        [
            "eval",
            "--target",
            str(tiny_target_dir),
            "--drafter",
            str(drafter),
            "--tree",
            "auto",
            "--tree-shapes",
            "60x7",
            "--out",
            str(tmp_path / "bad"),
        ],
    )
    assert bad.exit_code != 0 and "TOTALxDEPTHxTOPK" in bad.output


def test_the_line_a_gpu_run_prints_as_each_shape_s_graphs_are_ready():
    from draftsmith.evaluate.run import graphs_line

    line = graphs_line(Shape(4), 18.24, 3, True)
    assert (
        line == "eval: K=4: graphs ready in 18.2 s (the target's forward for 3 new widths, the drafter's compiled side)"
    )
    assert graphs_line(Shape(7, stop_below=0.09), 2.0, 0, False) == (
        "eval: K=7 stop<0.09: graphs ready in 2.0 s (the drafter's eager side)"
    )


def test_a_tree_larger_than_its_depth_and_top_k_can_draft_is_refused(tmp_path):
    """--total-tokens given beyond the nodes a tree drafts is refused with the most it can take; the default
    (60) on a small tree is cut to the tree's nodes, as the report's total_tokens shows."""
    from pydantic import ValidationError

    from draftsmith.evaluate.config import EvalConfig, tree_pool

    base = {"drafter": tmp_path / "d", "out": tmp_path / "o", "mode": "tree"}
    assert tree_pool(7, 10) == 610 and tree_pool(1, 10) == 10
    with pytest.raises(
        ValidationError,
        match="--total-tokens 611: a tree 7 deep with top-k 10 drafts 610 nodes to choose from, fewer than 611; give --total-tokens 610",
    ):
        EvalConfig(**base, depth=7, top_k=10, total_tokens=611)
    assert EvalConfig(**base, depth=7, top_k=10, total_tokens=610).total_tokens == 610
    assert EvalConfig(**base, depth=1, top_k=10).total_tokens == 60  # the default: cut to 10 by the proposer
