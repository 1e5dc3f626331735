"""Draft vocab semantics (issue 2, must-show item 4) and `draftsmith vocab` on a small dataset.

Padding rule (vocab.build_vocab): tokens are ranked by count descending, then by target id
ascending, so with fewer than k distinct assistant tokens the vocab is filled with the lowest
unseen target ids.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from typer.testing import CliRunner

from draftsmith.cli import app
from draftsmith.data.dataset import FORMAT, META_FILE, write_table
from draftsmith.data.vocab import build_vocab, load_vocab
from draftsmith.errors import UserError


def check_semantics(d2t: torch.Tensor, t2d: torch.Tensor, k: int) -> torch.Tensor:
    """Assert the EAGLE-3 invariants; return the target ids in draft order."""
    assert d2t.dtype == torch.int64 and d2t.shape == (k,)
    assert t2d.dtype == torch.bool and int(t2d.sum()) == k
    target_ids = torch.arange(k) + d2t  # target id = draft id + d2t[draft id]
    assert bool(t2d[target_ids].all())
    assert torch.equal(target_ids, torch.nonzero(t2d).flatten())  # draft ids follow target ids, one to one
    return target_ids


def test_top_k_by_frequency_on_a_constructed_example():
    counts = np.zeros(50, dtype=np.int64)
    counts[[40, 7, 13, 2, 31, 9]] = [100, 90, 80, 70, 5, 1]
    d2t, t2d = build_vocab(counts, size=4)
    assert check_semantics(d2t, t2d, 4).tolist() == [2, 7, 13, 40]  # the 4 most frequent, in id order
    d2t, t2d = build_vocab(counts, size=5)
    assert check_semantics(d2t, t2d, 5).tolist() == [2, 7, 13, 31, 40]


def test_ties_break_to_the_lower_id():
    counts = np.zeros(10, dtype=np.int64)
    counts[[8, 3, 5]] = 4
    _, t2d = build_vocab(counts, size=2)
    assert torch.nonzero(t2d).flatten().tolist() == [3, 5]


def test_fewer_distinct_tokens_than_k_pads_with_lowest_unseen_ids():
    counts = np.zeros(30, dtype=np.int64)
    counts[[25, 12]] = [3, 9]
    d2t, t2d = build_vocab(counts, size=5)
    assert check_semantics(d2t, t2d, 5).tolist() == [0, 1, 2, 12, 25]


def test_k_out_of_range():
    with pytest.raises(UserError, match="must be in 1..10"):
        build_vocab(np.ones(10), size=11)


def write_dataset(path: Path, samples: list[tuple[list[int], list[int]]], vocab: int) -> Path:
    path.mkdir(parents=True)
    write_table(
        path,
        {
            "sample_id": list(range(len(samples))),
            "input_ids": [s[0] for s in samples],
            "loss_mask": [s[1] for s in samples],
            "length": [len(s[0]) for s in samples],
        },
    )
    meta = {
        "format": FORMAT,
        "version": 1,
        "target": {"name": "t", "fingerprint": "f", "vocab_size": vocab},
        "max_len": 64,
    }
    (path / META_FILE).write_text(json.dumps(meta))
    return path


@pytest.fixture
def dataset(tmp_path):
    # token 1 is the most frequent overall but only in prompts (mask 0): it must not count
    samples = [
        ([1, 1, 1, 1, 5, 5, 9], [0, 0, 0, 0, 1, 1, 1]),
        ([1, 1, 1, 7, 5, 9, 9], [0, 0, 0, 1, 1, 1, 1]),
        ([1, 1, 3, 5], [0, 0, 1, 1]),
    ]  # assistant counts: 5 -> 4, 9 -> 3, 7 -> 1, 3 -> 1
    return write_dataset(tmp_path / "ds", samples, vocab=12)


def test_vocab_command_counts_only_assistant_tokens(dataset, tmp_path):
    out = tmp_path / "v" / "vocab.safetensors"
    r = CliRunner().invoke(app, ["vocab", str(dataset), "--draft-vocab-size", "3", "--out", str(out)])
    assert r.exit_code == 0, r.output
    d2t, t2d = load_vocab(out)
    assert check_semantics(d2t, t2d, 3).tolist() == [3, 5, 9]  # 5 and 9, then the 3/7 tie to the lower id
    assert "covers 88.89% of assistant tokens" in r.output  # (4 + 3 + 1) / 9
    with safe_open(str(out), "pt") as f:
        meta = f.metadata()
    assert meta["draft_vocab_size"] == "3" and json.loads(meta["target"])["fingerprint"] == "f"
    assert (out.parent / "vocab.safetensors.run.yaml").exists()


def test_vocab_default_size_is_capped_at_the_target_vocab(dataset, tmp_path):
    out = tmp_path / "vocab.safetensors"
    r = CliRunner().invoke(app, ["vocab", str(dataset), "--out", str(out)])
    assert r.exit_code == 0, r.output
    d2t, t2d = load_vocab(out)
    assert check_semantics(d2t, t2d, 12).tolist() == list(range(12))  # min(32000, 12): everything
    assert "padded with 8 unseen ids" in r.output


def test_vocab_file_is_atomic_with_the_normal_mode(dataset, tmp_path, monkeypatch):
    """Issue 16 item 14: no OUT.tmp left behind, the file mode follows the umask (not 0600), and a
    write that fails leaves nothing."""
    out = tmp_path / "v" / "vocab.safetensors"
    assert CliRunner().invoke(app, ["vocab", str(dataset), "--out", str(out)]).exit_code == 0
    mask = os.umask(0)
    os.umask(mask)
    assert out.stat().st_mode & 0o777 == 0o666 & ~mask
    assert [p.name for p in out.parent.iterdir() if "tmp" in p.name] == []

    monkeypatch.setattr("draftsmith.fsutil.os.fdopen", lambda fd, mode: _Failing(fd))
    failed = CliRunner().invoke(app, ["vocab", str(dataset), "--out", str(tmp_path / "w" / "vocab.safetensors")])
    assert failed.exit_code == 4 and "disk full" in failed.output, failed.output
    assert [p.name for p in (tmp_path / "w").iterdir()] == []


class _Failing:
    """A file object whose write fails as on a full disk."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __enter__(self) -> _Failing:
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)

    def write(self, data: bytes) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")


def test_vocab_refuses_existing_output(dataset, tmp_path):
    out = tmp_path / "vocab.safetensors"
    out.write_bytes(b"keep me")
    r = CliRunner().invoke(app, ["vocab", str(dataset), "--out", str(out)])
    assert r.exit_code != 0 and "--overwrite" in r.output
    assert out.read_bytes() == b"keep me"
    assert CliRunner().invoke(app, ["vocab", str(dataset), "--out", str(out), "--overwrite"]).exit_code == 0
    assert load_vocab(out)[1].sum() == 12


def test_vocab_on_a_folder_that_is_not_a_dataset(tmp_path):
    r = CliRunner().invoke(app, ["vocab", str(tmp_path), "--out", str(tmp_path / "v.safetensors")])
    assert r.exit_code != 0 and "not a prepared dataset" in r.output
    assert not (tmp_path / "v.safetensors").exists()


def test_the_old_size_option_still_works_with_a_warning(dataset, tmp_path):
    """`vocab --size` was renamed `--draft-vocab-size` (train's name for the same number): the
    old flag and the old YAML key still work for a release and say what to use instead."""
    import yaml

    r = CliRunner().invoke(app, ["vocab", str(dataset), "--size", "3", "--out", str(tmp_path / "a.safetensors")])
    assert r.exit_code == 0, r.output
    assert "'size' (--size) is deprecated" in r.output and "--draft-vocab-size" in r.output
    assert check_semantics(*load_vocab(tmp_path / "a.safetensors"), 3).tolist() == [3, 5, 9]
    (tmp_path / "c.yaml").write_text(yaml.safe_dump({"size": 2}))
    r = CliRunner().invoke(
        app, ["vocab", str(dataset), "--config", str(tmp_path / "c.yaml"), "--out", str(tmp_path / "b.safetensors")]
    )
    assert r.exit_code == 0 and "deprecated" in r.output, r.output
    assert load_vocab(tmp_path / "b.safetensors")[1].sum() == 2
