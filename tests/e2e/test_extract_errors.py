"""Must show 3 and 4 through the CLI: a full disk (a real 5 MB tmpfs when it can be mounted) and
bad input, each a clear error and a non-zero exit, with valid output kept."""

import contextlib
import json
import subprocess

import numpy as np
import pytest
from typer.testing import CliRunner

from draftsmith.cli import app
from draftsmith.data.store import MANIFEST, StoreReader, read_manifest
from tests.helpers import make_tiny_llama, write_tokenized_dataset


def extract(ds, target, out, *extra):
    args = [
        "extract",
        str(ds),
        "--target",
        str(target),
        "--out",
        str(out),
        "--device",
        "cpu",
        "--token-budget",
        "256",
        *extra,
    ]
    return CliRunner().invoke(app, args)


@pytest.fixture
def dataset(tmp_path):
    rng = np.random.default_rng(3)
    return write_tokenized_dataset(tmp_path / "ds", [rng.integers(0, 49152, size=40).tolist() for _ in range(200)])


@contextlib.contextmanager
def tmpfs(path, size):
    path.mkdir()
    if subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True
    ).returncode:
        pytest.skip(
            "cannot mount a tmpfs here (needs root); tests/unit/test_extract_run.py covers this with an injected ENOSPC"
        )
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=False)


@pytest.mark.slow
def test_disk_full_on_tmpfs(tmp_path, dataset, tiny_target_dir):
    # 200 samples x 40 tokens x (3+1) x 64 x 4 bytes ~ 8.2 MB: more than the 5 MB disk holds
    with tmpfs(tmp_path / "small", "5m") as disk:
        out = disk / "store"
        refused = extract(dataset, tiny_target_dir, out)
        assert refused.exit_code == 2 and "not enough disk" in refused.output
        assert not out.exists()  # nothing left behind

        forced = extract(dataset, tiny_target_dir, out, "--force")
        assert forced.exit_code == 4 and "disk full" in forced.output, forced.output
        kept = StoreReader(out)
        assert 0 < len(kept) < 200
        for i in range(len(kept)):
            kept.verify(i)
        assert not list(out.glob("rows_*/.*tmp"))

        subprocess.run(["mount", "-o", "remount,size=20m", str(disk)], check=True)  # space freed
        resumed = extract(dataset, tiny_target_dir, out, "--force")
        assert resumed.exit_code == 0, resumed.output
        reader = StoreReader(out)
        assert len(reader) == 200 and reader.meta["complete"]
        ids = [json.loads(x)["sample_id"] for x in (out / MANIFEST).read_text().splitlines()]
        assert sorted(ids) == list(range(200))


def test_unprepared_dataset(tmp_path, tiny_target_dir):
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "chats.jsonl").write_text('{"messages": []}\n')
    r = extract(tmp_path / "raw", tiny_target_dir, tmp_path / "store")
    assert r.exit_code == 2 and "not a prepared dataset" in r.output and "draftsmith prepare" in r.output
    assert not (tmp_path / "store").exists()


def test_layer_ids_out_of_range(tmp_path, dataset, tiny_target_dir):
    r = extract(dataset, tiny_target_dir, tmp_path / "store", "--aux-layer-ids", "0,1,3")
    assert r.exit_code == 2 and "out of range" in r.output and "0..2" in r.output
    assert not (tmp_path / "store").exists()


@pytest.mark.slow
def test_store_of_another_target_or_aux_layer_ids(tmp_path, dataset, tokenizer):
    out, five = tmp_path / "store", tmp_path / "five-layers"  # room for two sets of capturable ids (1..4)
    make_tiny_llama(len(tokenizer), num_layers=5).save_pretrained(five)
    tokenizer.save_pretrained(five)
    assert extract(dataset, five, out, "--aux-layer-ids", "1,2,3").exit_code == 0
    before = read_manifest(out)
    other = tmp_path / "other-target"
    make_tiny_llama(len(tokenizer), num_layers=5, hidden=32).save_pretrained(other)
    tokenizer.save_pretrained(other)
    r = extract(dataset, other, out, "--aux-layer-ids", "1,2,3")
    assert r.exit_code == 2 and "refusing to mix" in r.output and "target fingerprint" in r.output
    r = extract(dataset, five, out, "--aux-layer-ids", "1,2,4")
    assert r.exit_code == 2 and "refusing to mix" in r.output and "aux_layer_ids: store has [1, 2, 3]" in r.output
    assert read_manifest(out) == before


def test_unwritable_output_folder(tmp_path, dataset, tiny_target_dir):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    r = extract(dataset, tiny_target_dir, blocker / "store")
    assert r.exit_code == 2 and "a part of this path is a file" in r.output
    with tmpfs(tmp_path / "ro", "1m") as ro:
        subprocess.run(["mount", "-o", "remount,ro", str(ro)], check=True)
        r = extract(dataset, tiny_target_dir, ro / "store")
        assert r.exit_code == 2 and "read-only" in r.output, r.output


@pytest.mark.slow
def test_two_extracts_on_one_out(tmp_path, dataset, tiny_target_dir):
    """Two extractions into one --out: the second is refused (naming the first's pid) while the
    first runs, and the first completes the store with each sample once."""
    import sys
    import time

    from draftsmith.fsutil import LOCK_FILE

    out = tmp_path / "store"
    cmd = [
        sys.executable,
        "-m",
        "draftsmith",
        "extract",
        str(dataset),
        "--target",
        str(tiny_target_dir),
        "--out",
        str(out),
        "--device",
        "cpu",
        "--token-budget",
        "256",
    ]
    first = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while not ((out / LOCK_FILE).exists() and (out / LOCK_FILE).read_text().strip()) and time.time() < deadline:
        time.sleep(0.01)
    second = extract(dataset, tiny_target_dir, out)
    assert second.exit_code == 2 and f"another draftsmith process (pid {first.pid})" in second.output, second.output
    assert first.wait(timeout=300) == 0, first.stderr.read()
    ids = [json.loads(line)["sample_id"] for line in (out / MANIFEST).read_text().splitlines()]
    assert sorted(ids) == list(range(200))
