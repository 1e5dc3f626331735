"""`output_lock`: one writer per output folder, a clear error naming the holder for a second
one (another process or not), nothing left behind in a folder it created for nothing."""

import os
import subprocess
import sys

import pytest

from draftsmith.errors import UserError
from draftsmith.fsutil import LOCK_FILE, output_lock


def test_a_second_writer_is_refused_with_the_holders_pid(tmp_path):
    out = tmp_path / "out"
    with output_lock(out):
        (out / "data").write_text("x")
        with pytest.raises(
            UserError, match=rf"{out} is being written by another draftsmith process \(pid {os.getpid()}\)"
        ):
            with output_lock(out):
                pass
    with output_lock(out):  # released when the holder is done
        pass
    assert sorted(os.listdir(out)) == [LOCK_FILE, "data"]


def test_the_lock_of_a_killed_process_is_released(tmp_path):
    out = tmp_path / "out"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\nfrom draftsmith.fsutil import output_lock\n"
            f"with output_lock({str(out)!r}):\n    print('locked', flush=True)\n    time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(UserError, match=rf"pid {holder.pid}\)"):
            with output_lock(out):
                pass
    finally:
        holder.kill()
        holder.wait()
    with output_lock(out):
        pass


def test_a_folder_created_for_nothing_is_removed(tmp_path):
    out = tmp_path / "new"
    with pytest.raises(RuntimeError):
        with output_lock(out):
            raise RuntimeError("the stage failed before writing")
    assert not out.exists()
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(UserError, match="a part of this path is a file"):
        with output_lock(blocker / "out"):
            pass


def test_an_output_that_appears_meanwhile_is_not_replaced(tmp_path):
    """Two runs with one --out (prepare, export, eval): both passed the existence check; the one
    that finishes second does not delete the first one's folder without --overwrite."""
    from draftsmith.fsutil import MADE_FILE, atomic_output_dir, mark_output

    out = tmp_path / "ds"
    with pytest.raises(UserError, match="appeared while this run was writing"):
        with atomic_output_dir(out, "prepare") as tmp:
            (tmp / "mine").write_text("second run")
            out.mkdir()
            (out / "theirs").write_text("first run")  # the other run renamed its folder into place
    assert [p.name for p in out.iterdir()] == ["theirs"]
    assert [p.name for p in tmp_path.iterdir()] == ["ds"]  # no temporary folder left
    mark_output(out, "prepare")  # as the other prepare run marked it
    with atomic_output_dir(out, "prepare", overwrite=True) as tmp:
        (tmp / "mine").write_text("replaces it")
    assert sorted(p.name for p in out.iterdir()) == [MADE_FILE, "mine"]
    assert [p.name for p in tmp_path.iterdir()] == ["ds"]  # the old folder, moved aside, is deleted


def test_a_full_disk_while_appending_names_the_file(tmp_path, monkeypatch):
    import errno

    from draftsmith import fsutil

    def full(fd, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(fsutil.os, "write", full)
    with pytest.raises(OSError) as e:
        fsutil.append_line(tmp_path / "c.jsonl", "{}")
    assert e.value.errno == errno.ENOSPC and e.value.filename == str(tmp_path / "c.jsonl")
