"""The walked acceptance (train/walk.py): validation answers crossed cycle by cycle, as a chain
of K drafts decodes them, against the simulated τ that starts a chain at every position."""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

from draftsmith.cli import app
from draftsmith.train.metrics import read_metrics
from draftsmith.train.walk import walk_counts


def test_a_walk_jumps_over_the_accepted_drafts_and_restarts_at_each_answer():
    runs = torch.tensor(
        [
            [2, 0, 1, 3, 0, 0, 1, 0],  # one answer: cycles at 0 (2 accepted), 3 (3), 7 (0)
            [1, 3, 0, 0, 2, 1, 0, 1],
        ]
    )  # answers 0..2 and 4..7: cycles at 0 (1), 2 (0); 4 (2), 7 (1)
    answer = torch.tensor([[True] * 8, [True, True, True, False, True, True, True, True]])
    cycles, reach = walk_counts(runs, answer, ttt=3)
    assert cycles.tolist() == [7.0] * 3
    assert reach.tolist() == [5.0, 3.0, 1.0]  # accepted 2, 3, 0 | 1, 0, 2, 1: at least 1, 2, 3 drafts
    tokens = sum(a + 1 for a in (2, 3, 0, 1, 0, 2, 1))
    assert 1 + reach.sum() / cycles[0] == pytest.approx(tokens / 7)  # tau_walk = tokens per target call


def test_uneven_acceptance_walks_below_the_simulated_tau():
    """Half the positions accept every draft, half none: a chain started at every position
    averages (8 + 1) / 2 = 4.5 tokens, but the easy half is crossed in few cycles."""
    runs = torch.tensor([[7] * 64 + [0] * 64])
    cycles, reach = walk_counts(runs, torch.ones_like(runs, dtype=torch.bool), ttt=7)
    assert cycles[0] == 8 + 64 and 1 + reach.sum() / cycles[0] == pytest.approx(128 / 72)


@pytest.mark.slow
def test_validation_records_the_walk_and_training_does_not(tmp_path, tiny_target_dir):
    import numpy as np

    from tests.helpers import write_tokenized_dataset

    g = np.random.default_rng(0)
    ds = write_tokenized_dataset(
        tmp_path / "ds", [g.integers(3, 400, size=int(g.integers(12, 40))).tolist() for _ in range(12)]
    )
    res = CliRunner().invoke(
        app,
        [
            "train",
            str(ds),
            "--target",
            str(tiny_target_dir),
            "--out",
            str(tmp_path / "run"),
            "--steps",
            "3",
            "--depth",
            "3",
            "--batch-tokens",
            "96",
            "--draft-vocab-size",
            "300",
            "--log-every",
            "1",
            "--val-fraction",
            "0.3",
            "--device",
            "cpu",
        ],
    )
    assert res.exit_code == 0, res.output
    records = read_metrics(tmp_path / "run")
    val = [r for r in records if r["split"] == "val"]
    assert val and all(
        len(r["walk_accept_k"]) == 3 and r["tau_walk"] == pytest.approx(1 + sum(r["walk_accept_k"])) for r in val
    )
    assert all("tau_walk" not in r for r in records if r["split"] == "train")
