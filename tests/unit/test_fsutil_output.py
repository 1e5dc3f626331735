"""`check_output`, the one rule of where an output may go, and `content_id`, what a pipeline's
done marker records of an external input."""

import json
import os
import shutil
from pathlib import Path

import pytest

from draftsmith.errors import UserError
from draftsmith.fsutil import SMALL_FILE, atomic_output_dir, check_output, content_id, mark_output
from draftsmith.pipeline.run import changed_files


@pytest.mark.parametrize("out", ["/", os.path.expanduser("~"), ".", ".."])
def test_root_home_and_the_current_folder_are_refused(out):
    with pytest.raises(UserError, match="needs an output folder of its own"):
        check_output(Path(out), "prepare", overwrite=True)


def test_a_file_output_may_sit_in_the_current_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert check_output(Path("c.jsonl"), "synth", folder=False) == tmp_path / "c.jsonl"


def test_an_input_is_never_the_output(tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("{}\n")
    with pytest.raises(UserError, match=f"--out {prompts} is this command's input"):
        check_output(prompts, "synth", [prompts], folder=False)
    link = tmp_path / "link.jsonl"
    link.symlink_to(prompts)
    with pytest.raises(UserError, match="is this command's input"):
        check_output(link, "synth", [prompts], folder=False)  # the same file under another name
    with pytest.raises(UserError, match=f"--out {tmp_path} holds this command's input"):
        check_output(tmp_path, "prepare", [prompts, "gsm8k", None])


def test_an_output_inside_an_inputs_run_is_refused(tmp_path):
    run = tmp_path / "train"
    (run / "drafter").mkdir(parents=True)
    check_output(run / "exported", "export", [run / "drafter"])  # not marked: no run to protect
    mark_output(run, "train")
    with pytest.raises(UserError, match=f"inside {run}, the output of the `draftsmith train` run"):
        check_output(run / "exported", "export", [run / "drafter"])
    check_output(tmp_path / "exported", "export", [run / "drafter"])


def test_overwrite_replaces_only_an_output_of_the_same_command(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    check_output(out, "prepare", overwrite=True)  # empty: nothing to lose
    (out / "notes.txt").write_text("x")
    with pytest.raises(UserError, match="has no .draftsmith marker"):
        check_output(out, "prepare", overwrite=True)
    mark_output(out, "eval")
    with pytest.raises(UserError, match="it is the output of `draftsmith eval`"):
        check_output(out, "prepare", overwrite=True)
    check_output(out, "eval", overwrite=True)
    (tmp_path / "file").write_text("x")
    with pytest.raises(UserError, match="is a file, and `draftsmith eval` writes a folder"):
        check_output(tmp_path / "file", "eval", overwrite=True)


def test_a_failed_replacement_keeps_the_old_output(tmp_path):
    out = tmp_path / "out"
    with atomic_output_dir(out, "eval") as tmp:
        (tmp / "old").write_text("1")
    with pytest.raises(RuntimeError), atomic_output_dir(out, "eval", overwrite=True) as tmp:
        (tmp / "new").write_text("2")
        raise RuntimeError("the stage failed")
    assert (out / "old").read_text() == "1" and sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_content_id_follows_the_content_not_the_times(tmp_path):
    small, big, folder = tmp_path / "s.jsonl", tmp_path / "b.bin", tmp_path / "d"
    small.write_text("a\n")
    first = content_id(small)
    os.utime(small, (0, 0))
    assert content_id(small) == first  # its bytes, not its time
    small.write_text("b\n")
    assert content_id(small) != first
    data = bytearray(os.urandom(3 * SMALL_FILE))  # a large file: size and blocks
    big.write_bytes(data)
    first = content_id(big)
    os.utime(big, (1, 1))
    copy = tmp_path / "copy" / "b.bin"
    copy.parent.mkdir()
    shutil.copyfile(big, copy)
    assert content_id(big) == content_id(copy) == first  # a copy, or a rewrite of the same bytes: the same id
    for at in (0, len(data) - 1):  # an edit of its first or its last byte (one between blocks is not seen)
        edited = bytearray(data)
        edited[at] ^= 1
        big.write_bytes(edited)
        assert content_id(big) != first, at
    big.write_bytes(data + b"x")
    assert content_id(big) != first
    weights = bytearray(os.urandom(16 * SMALL_FILE))  # a block per 2 MiB: a change to an eighth of the bytes
    big.write_bytes(weights)  # between the 4 blocks a smaller file gets (at 0, 1/3, 2/3 and the end) is seen
    first = content_id(big)
    weights[2 * SMALL_FILE : 4 * SMALL_FILE] = os.urandom(2 * SMALL_FILE)
    big.write_bytes(weights)
    assert content_id(big) != first
    folder.mkdir()
    (folder / "a").write_text("1")
    first = content_id(folder)
    (folder / ".draftsmith.lock").write_text("123\n")
    assert content_id(folder) == first
    (folder / "b").write_text("2")
    assert content_id(folder) != first


def test_a_content_id_of_the_earlier_scheme_is_not_compared(tmp_path):
    """Markers of a pipeline run before content ids hashed large files (their size and time, which
    a copy changes) or before they read up to 64 blocks of one (c2: 4 blocks) rerun nothing; an id of this scheme that differs reruns the stage."""
    done, conv = tmp_path / "prepare.done", tmp_path / "conv.jsonl"
    conv.write_text("a\n")
    now = {str(conv): content_id(conv)}
    for earlier in ("0123456789abcdef01234567", "c2:0123456789abcdef01234567", "c3:0123456789abcdef01234567"):
        done.write_text(json.dumps({"files": {str(conv): earlier}}))  # size and time; 4 blocks; up to 64 blocks
        assert changed_files(done, now) == []
    done.write_text(json.dumps({"files": {str(conv): "c4:0123456789abcdef01234567"}}))
    assert changed_files(done, now) == [f"input {conv} changed"]
    done.write_text(json.dumps({"files": now}))
    assert changed_files(done, now) == []
