"""`draftsmith synth` killed mid-run and rerun: every id exactly once, nothing torn. Also the
torchrun data-parallel run (2 CPU ranks): disjoint shards merged into one file. Both use a tiny
random Llama saved as a model folder, so the subprocesses start and generate fast."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import make_tiny_llama

pytestmark = pytest.mark.slow
N = 80


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory, tokenizer):
    folder = tmp_path_factory.mktemp("tiny_target")
    make_tiny_llama(len(tokenizer)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture
def prompts(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"Question {i}: what is {i} plus {i}?"}) + "\n" for i in range(N)))
    return path


def _cmd(prompts: Path, target: Path, out: Path) -> list[str]:
    return [
        "-m",
        "draftsmith.cli",
        "synth",
        str(prompts),
        "--target",
        str(target),
        "--out",
        str(out),
        "--device",
        "cpu",
        "--temperature",
        "1",
        "--max-new-tokens",
        "6",
        "--keep-unfinished",
        "--batch-size",
        "2",
    ]


def _ids(*paths: Path) -> list[str]:
    ids = []
    for p in paths:
        if p.exists():
            ids += [json.loads(line)["id"] for line in p.read_text().splitlines()]  # every line parses
    return ids


def test_kill_and_resume(tiny_folder, prompts, tmp_path):
    out = tmp_path / "synth" / "convs.jsonl"
    dropped = out.with_name("convs.dropped.jsonl")
    proc = subprocess.Popen(
        [sys.executable, *_cmd(prompts, tiny_folder, out)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.time() + 300
    while not (out.exists() and out.read_bytes().count(b"\n") >= 2):
        assert proc.poll() is None and time.time() < deadline, "the first run ended before any output appeared"
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    before = _ids(out, dropped)
    assert 2 <= len(before) < N, "killed too late to test resume"
    with out.open("ab") as f:  # what a crash inside a write leaves behind
        f.write(b'{"id": "torn", "messages": [{"role": "us')

    subprocess.run([sys.executable, *_cmd(prompts, tiny_folder, out)], check=True, capture_output=True, timeout=600)
    after = _ids(out, dropped)
    assert sorted(after) == sorted(f"prompts:line-{i}:s0" for i in range(1, N + 1))  # each id exactly once
    assert after[: len(before)] == before  # the first run's lines are untouched
    progress = json.loads((out.parent / f"{out.stem}.synth" / "progress.json").read_text())
    assert progress["status"] == "done" and progress["skipped"] == len(before) and progress["done"] == N - len(before)


def test_torchrun_two_ranks_merge(tiny_folder, prompts, tmp_path):
    out = tmp_path / "dp" / "convs.jsonl"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            "2",
            *_cmd(prompts, tiny_folder, out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert sorted(_ids(out, out.with_name("convs.dropped.jsonl"))) == sorted(
        f"prompts:line-{i}:s0" for i in range(1, N + 1)
    )
    assert not list(out.parent.glob("*.part*"))  # rank 0 merged the parts and removed them
