"""Issue 42's rules at the unit level: the one safetensors writer (a refused write is the OSError
naming the file, no file is left, the mode follows the umask), exit 4 for a full disk and the
file-size limit, the draft vocab's minimum, the drafter loader's finite check, and the store's
up-front file check."""

from __future__ import annotations

import errno
import json
import os
import resource
from pathlib import Path

import pytest
import torch

from draftsmith.data.store import MANIFEST, StoreReader
from draftsmith.data.vocab import draft_vocab_size
from draftsmith.draft.checkpoint import check_finite, save_file
from draftsmith.errors import StageFailed, UserError, from_os_error


def test_save_file_raises_the_os_error_naming_the_file_and_leaves_none(tmp_path: Path) -> None:
    path = tmp_path / "w.safetensors"
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, hard))
    try:
        with pytest.raises(OSError) as e:
            save_file({"w": torch.zeros(10_000)}, path)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert e.value.errno == errno.EFBIG and e.value.filename == str(path)
    assert os.listdir(tmp_path) == []


def test_save_file_gives_the_umask_mode(tmp_path: Path) -> None:
    mask = os.umask(0o027)
    try:
        save_file({"w": torch.zeros(4)}, tmp_path / "w.safetensors")
    finally:
        os.umask(mask)
    assert (tmp_path / "w.safetensors").stat().st_mode & 0o777 == 0o640


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT, errno.EFBIG])
def test_a_full_disk_or_file_size_limit_is_exit_4_naming_the_file(code: int) -> None:
    e = from_os_error(OSError(code, os.strerror(code), "/x/model.safetensors"), "nothing was written at /x")
    assert isinstance(e, StageFailed) and e.exit_code == 4
    assert str(e).startswith("/x/model.safetensors: ") and str(e).endswith("nothing was written at /x")


def test_a_one_token_draft_vocab_is_refused_with_the_reason() -> None:
    with pytest.raises(UserError, match="the loss is 0"):
        draft_vocab_size(1, 100)
    assert draft_vocab_size(2, 100) == 2 and draft_vocab_size(None, 100) == 100


def test_check_finite_names_the_weights() -> None:
    check_finite({"a": torch.ones(2), "ids": torch.arange(2)}, "drafter d")
    with pytest.raises(UserError, match=r"drafter d: NaN or Inf weights in b, c"):
        check_finite(
            {"a": torch.ones(2), "b": torch.tensor([float("inf")]), "c": torch.tensor([float("nan")])}, "drafter d"
        )


def _store(tmp_path: Path, size: int, data: bytes) -> StoreReader:
    (tmp_path / "rows_0-1999").mkdir()
    (tmp_path / "rows_0-1999" / "0.safetensors").write_bytes(data)
    (tmp_path / "store.json").write_text(
        json.dumps(
            {
                "format": "draftsmith-hidden-store",
                "version": 1,
                "n_aux": 3,
                "hidden_size": 4,
                "aux_layer_ids": [0, 1, 2],
            }
        )
    )
    (tmp_path / MANIFEST).write_text(
        json.dumps(
            {"sample_id": 0, "path": "rows_0-1999/0.safetensors", "tokens": 2, "bytes": size, "crc32": "00000000"}
        )
        + "\n"
    )
    return StoreReader(tmp_path)


def test_the_store_check_finds_a_truncated_file_by_its_size(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="is 3 bytes but the manifest says 10: truncated"):
        _store(tmp_path, 10, b"abc").check_files()


def test_the_store_check_reads_a_small_store_whole(tmp_path: Path) -> None:
    reader = _store(tmp_path, 3, b"abc")
    reader.check_files(read_all_below=0)  # sizes only: the bad checksum waits for the read
    with pytest.raises(UserError, match="is corrupt"):
        reader.check_files()
