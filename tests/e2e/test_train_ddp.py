"""`torchrun --nproc-per-node 2` on CPU (gloo): DDP (with Muon) and FSDP2 (with AdamW) give the
same metrics as one process with the same global batch (2 rows per step through --grad-accum 2)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from draftsmith.train.metrics import read_metrics
from tests.helpers import write_tokenized_dataset

pytestmark = pytest.mark.slow


def _args(ds, target, out):
    return [
        "train",
        str(ds),
        "--target",
        str(target),
        "--out",
        str(out),
        "--steps",
        "4",
        "--depth",
        "2",
        "--batch-tokens",
        "64",
        "--draft-vocab-size",
        "300",
        "--log-every",
        "2",
        "--device",
        "cpu",
    ]


@pytest.mark.skipif(shutil.which("torchrun") is None, reason="torchrun not on PATH")
def test_two_ranks_match_one_process(tmp_path, tiny_target_dir):
    g = np.random.default_rng(0)
    ds = write_tokenized_dataset(
        tmp_path / "ds", [g.integers(3, 400, size=int(g.integers(10, 30))).tolist() for _ in range(30)]
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    # Muon (the default) needs whole matrices, so FSDP2 trains with AdamW; each is compared with one
    # process running the same optimizer
    for strategy, optimizer in (("ddp", "muon"), ("fsdp", "adamw")):
        subprocess.run(
            [
                sys.executable,
                "-m",
                "draftsmith",
                *_args(ds, tiny_target_dir, tmp_path / f"one-{optimizer}"),
                "--grad-accum",
                "2",
                "--optimizer",
                optimizer,
            ],
            check=True,
            env=env,
            capture_output=True,
        )
        one = read_metrics(tmp_path / f"one-{optimizer}")
        out = tmp_path / strategy
        subprocess.run(
            [
                "torchrun",
                "--standalone",
                "--nproc-per-node",
                "2",
                "-m",
                "draftsmith",
                *_args(ds, tiny_target_dir, out),
                "--distributed",
                strategy,
                "--optimizer",
                optimizer,
            ],
            check=True,
            env=env,
            capture_output=True,
        )
        two = read_metrics(out)
        assert [(r["split"], r["step"]) for r in two] == [(r["split"], r["step"]) for r in one]
        for a, b in zip(one, two):
            assert abs(a["loss"] - b["loss"]) < 1e-4 and a["valid_tokens"] == b["valid_tokens"], (strategy, a, b)
        assert (out / "drafter" / "drafter.json").exists()
