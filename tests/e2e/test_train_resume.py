"""Kill `draftsmith train` mid-epoch with SIGKILL, resume it, and check that the resumed run
continues the uninterrupted run's curve: the same metrics at the same steps."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from draftsmith.train.metrics import read_metrics
from tests.helpers import write_tokenized_dataset

pytestmark = pytest.mark.slow

STEPS = 24


def _cmd(ds, target, out, *extra):
    return [
        sys.executable,
        "-m",
        "draftsmith",
        "train",
        str(ds),
        "--target",
        str(target),
        "--out",
        str(out),
        "--steps",
        str(STEPS),
        "--depth",
        "3",
        "--batch-tokens",
        "64",
        "--draft-vocab-size",
        "300",
        "--log-every",
        "1",
        "--save-every",
        "5",
        "--val-fraction",
        "0.1",
        "--lr",
        "1e-3",
        "--device",
        "cpu",
        *extra,
    ]


def _env():
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}


def test_kill_and_resume_continues_the_same_curve(tmp_path, tiny_target_dir):
    g = np.random.default_rng(0)
    ds = write_tokenized_dataset(
        tmp_path / "ds", [g.integers(3, 400, size=int(g.integers(10, 30))).tolist() for _ in range(60)]
    )
    ref_out, out = tmp_path / "ref", tmp_path / "killed"
    subprocess.run(_cmd(ds, tiny_target_dir, ref_out), check=True, env=_env(), capture_output=True)

    proc = subprocess.Popen(
        _cmd(ds, tiny_target_dir, out), env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.time() + 120
    while not (out / "checkpoints" / "step_00000010").exists():
        assert proc.poll() is None and time.time() < deadline, "the run ended before it could be killed"
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    killed_at = max(r["step"] for r in read_metrics(out))
    assert killed_at < STEPS, "the kill landed after training finished"

    subprocess.run(_cmd(ds, tiny_target_dir, out, "--resume"), check=True, env=_env(), capture_output=True)
    ref = {(r["split"], r["step"]): r for r in read_metrics(ref_out)}
    got = [(r["split"], r["step"]) for r in read_metrics(out)]
    assert got == list(ref), "the resumed run logged different steps (duplicates or gaps)"
    for r in read_metrics(out):
        want = ref[(r["split"], r["step"])]
        for key in ("loss", "tau"):
            assert abs(r[key] - want[key]) < 1e-4, (r["step"], key, r[key], want[key])
        assert np.allclose(r["acc_k"], want["acc_k"], atol=1e-4) and np.allclose(r["loss_k"], want["loss_k"], atol=1e-4)
    assert ref[("train", STEPS)]["loss"] < ref[("train", 1)]["loss"]
    assert (out / "drafter" / "drafter.json").exists()
