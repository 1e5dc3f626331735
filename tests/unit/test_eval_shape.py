"""`--k auto`: the chain length with the best predicted speed, from acceptance and measured cycle
costs. The arithmetic on hand-made numbers, the calibration on the tiny Llama with a perfect and
a useless proposer, and the CLI's report."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from draftsmith.cli import app
from draftsmith.draft.checkpoint import save_drafter
from draftsmith.evaluate.decode import plain_generate
from draftsmith.evaluate.proposer import DrafterProposer, OracleProposer, random_drafter
from draftsmith.evaluate.shape import Calibration, calibrate, conditional_acceptance
from draftsmith.layers import default_aux_layers
from draftsmith.runtime.engine import TargetEngine
from draftsmith.runtime.sampling import Sampling


def test_conditional_acceptance_counts_cycles_that_got_that_far():
    assert conditional_acceptance([0, 1, 3, 3, 2], 3) == pytest.approx([4 / 5, 3 / 4, 2 / 3])
    assert conditional_acceptance([0, 0], 2) == [0.0, 0.0]  # nothing reached position 2: 0, not a division by 0


def test_best_k_trades_acceptance_against_cycle_cost():
    cal = Calibration([0.9, 0.9, 0.9, 0.1], {1: 1.1, 2: 1.2, 3: 1.3, 4: 1.4}, plain_seconds=1.0, tokens=100)
    assert cal.expected_tokens(2) == pytest.approx(1 + 0.9 + 0.81)
    assert cal.best() == 3  # the 4th position is accepted too rarely to pay for its cost
    useless = Calibration([0.0] * 4, {1: 1.1, 2: 1.2, 3: 1.3, 4: 1.4}, plain_seconds=1.0, tokens=100)
    assert useless.best() == 1 and useless.predicted_speedup(1) < 1
    d = cal.to_dict()
    assert d["chosen_k"] == 3 and [c["k"] for c in d["candidates"]] == [1, 2, 3, 4]


def test_calibration_on_the_engine(tiny_model):
    model = tiny_model
    engine = TargetEngine(model, default_aux_layers(2), max_len=128)
    prompt = torch.randint(3, 300, (9,), generator=torch.Generator().manual_seed(0)).tolist()
    reference = prompt + plain_generate(engine, prompt, 40, set(), Sampling()).tokens
    oracle = calibrate(engine, lambda k: OracleProposer(reference, depth=k), [prompt], 24, set(), Sampling, k_max=4)
    assert oracle.accept_cond == [1.0] * 4 and oracle.tokens == 24
    assert oracle.expected_tokens(4) == 5 and set(oracle.cycle_seconds) == {1, 2, 3, 4}
    drafter = random_drafter(model, draft_vocab_size=300)
    useless = calibrate(engine, lambda k: DrafterProposer(drafter, Sampling(), 128, depth=k), [prompt], 24, set(),
                        Sampling, k_max=3)
    assert useless.accept_cond[0] < 0.5 and useless.best() == 1  # a draft that is rarely right: the shortest chain


def test_cli_k_auto_reports_its_choice(tiny_model, tiny_target_dir, tmp_path):
    drafter = save_drafter(random_drafter(tiny_model, draft_vocab_size=300), tmp_path / "drafter")
    (tmp_path / "q.jsonl").write_text("\n".join(json.dumps({"turns": [t]}) for t in ("What is 2+2?", "Name a colour.")) + "\n")
    res = CliRunner().invoke(app, ["eval", "--target", str(tiny_target_dir), "--drafter", str(drafter), "--bench",
                                   str(tmp_path / "q.jsonl"), "--k", "auto", "--k-max", "3", "--max-new-tokens", "12",
                                   "--calibration-questions", "1", "--out", str(tmp_path / "eval")])
    assert res.exit_code == 0, res.output
    assert "--k auto chose K=" in res.output
    report = json.loads((tmp_path / "eval" / "report.json").read_text())
    shape = report["shape"]
    assert report["k_requested"] == "auto" and report["k"] == shape["chosen_k"] in (1, 2, 3)
    assert len(report["accept_per_position"]) == report["k"] and len(shape["candidates"]) == 3
    assert report["greedy_turns_matching_plain"] == report["turns"]
    assert "`--k auto` chose" in (tmp_path / "eval" / "report.md").read_text()
    tree = CliRunner().invoke(app, ["eval", "--target", str(tiny_target_dir), "--drafter", str(drafter), "--k", "auto",
                                    "--mode", "tree", "--out", str(tmp_path / "tree")])
    assert tree.exit_code == 2 and "--k auto chooses a chain length" in tree.output
