"""Must show 2: SIGKILL `draftsmith extract` at random points mid-run (at least 5 times), then
resume. The store is complete, every file validates, and the manifest lists each sample once."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from draftsmith.data.store import MANIFEST, StoreReader
from tests.helpers import write_tokenized_dataset

pytestmark = pytest.mark.slow

N = 250


def manifest_lines(out):
    m = out / MANIFEST
    return m.read_bytes().count(b"\n") if m.exists() else 0


def test_kill_and_resume(tmp_path, tiny_target_dir):
    rng = np.random.default_rng(7)
    samples = [rng.integers(0, 49152, size=int(rng.integers(5, 30))).tolist() for _ in range(N)]
    ds = write_tokenized_dataset(tmp_path / "ds", samples)
    out = tmp_path / "store"
    cmd = [
        sys.executable,
        "-m",
        "draftsmith",
        "extract",
        str(ds),
        "--target",
        str(tiny_target_dir),
        "--out",
        str(out),
        "--device",
        "cpu",
        "--token-budget",
        "64",
        "--writers",
        "2",
        "--check-every",
        "50",
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    kills = 0
    for _ in range(7):
        before = manifest_lines(out)
        goal = before + int(rng.integers(1, 30))
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
        while proc.poll() is None and manifest_lines(out) < goal:
            time.sleep(0.005)
        time.sleep(float(rng.uniform(0, 0.03)))
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            kills += 1
        else:
            assert proc.returncode == 0, proc.stderr.read().decode()
            break
        if kills >= 5:
            break
    assert kills >= 5
    assert 0 < manifest_lines(out) < N  # the kills landed mid-run
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    assert "skipped" in done.stderr
    ids = [json.loads(line)["sample_id"] for line in (out / MANIFEST).read_text().splitlines()]
    assert sorted(ids) == list(range(N))  # each sample exactly once
    reader = StoreReader(out)
    assert reader.meta["complete"] and reader.meta["totals"]["samples"] == N
    for i in range(N):
        reader.verify(i)
        assert reader[i]["input_ids"].tolist() == samples[reader.sample_ids[i]]
    files = sorted(p.name for p in out.glob("rows_*/*"))
    assert len(files) == N and not [f for f in files if f.endswith(".tmp")]
