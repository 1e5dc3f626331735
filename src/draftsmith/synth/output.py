"""The synth output files: append-only JSONL, resume, and data-parallel part files.

  OUT.jsonl                  kept conversations, one JSON object a line (what `prepare` reads)
  OUT.dropped.jsonl          dropped conversations: id, reason, the rejected text (inspection, resume)
  OUT.part{r}.jsonl, OUT.dropped.part{r}.jsonl   rank r's lines while a torchrun job runs
  OUT.synth/                 the runs' own files (`check_synth_folder`): progress.json, run.yaml, mix.json
                             and the output lock, never loose beside OUT (issue 55)

Every line goes out in one `append_line` (single write + fsync), so a crash leaves at most one
torn last line, which `repair_tail` cuts before anything is appended again. An id is done when
it appears in any of these files with the same resume key (a hash of its prompt, the generation
settings, the seed and the model: `synth/run.py`); a dropped id with another key (a rerun with
other settings) is tried again. A prompt answered before under another id with the same settings
and model has the same `repeat_key` and is skipped as a duplicate. Rank 0 merges the part files
into the main files at the end, skipping ids already there, and only then deletes them: a crash
at any instant loses no finished line and never duplicates an id.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from draftsmith.data.sources import SYNTH_FOLDER, synth_folder
from draftsmith.errors import UserError
from draftsmith.fsutil import append_line, holds_only_lock, made_by, read_jsonl
from draftsmith.synth.filters import normalize


def check_synth_folder(out: Path) -> Path:
    """`OUT.synth/` beside the output `out` (a resolved path), once it is safe to use: a file
    `--out` named like it, or such a folder that synth did not make, is refused, so that no
    progress.json, run.yaml or mix.json of another program is replaced."""
    side = synth_folder(out)
    if side == out:
        raise UserError(
            f"--out {out}: synth keeps its run's files in a folder named {side.name} beside the output; "
            f"give a file name that does not end in {SYNTH_FOLDER}, such as {out.with_suffix('.jsonl')}"
        )
    if side.exists() and not (side.is_dir() and (made_by(side) == "synth" or holds_only_lock(side))):
        raise UserError(
            f"{side} was not made by `draftsmith synth`, which keeps progress.json, run.yaml, mix.json and its "
            f"lock for {out.name} there; move {side} away yourself, or give another --out"
        )
    return side


def dropped_path(out: Path) -> Path:
    return out.with_name(f"{out.stem}.dropped.jsonl")


def part_path(path: Path, rank: int) -> Path:
    return path.with_name(f"{path.stem}.part{rank}.jsonl")


def parts(path: Path) -> list[Path]:
    return sorted(path.parent.glob(f"{path.stem}.part*.jsonl"))


def repair_tail(path: Path) -> None:
    """Cut a torn last line (no trailing newline: an append interrupted by a crash)."""
    if not path.exists() or path.stat().st_size == 0:
        return
    with path.open("rb+") as f:
        data = f.read()
        if data.endswith(b"\n"):
            return
        f.truncate(data.rfind(b"\n") + 1)


def read_records(path: Path) -> list[dict[str, Any]]:
    """Records of one output file (a torn last line is ignored); [] when it does not exist."""
    if not path.exists():
        return []
    return [rec for _, rec in read_jsonl(path) if isinstance(rec, dict) and "id" in rec]


def all_files(out: Path) -> list[Path]:
    """The main output, the dropped file and every rank's part files."""
    drop = dropped_path(out)
    return [out, *parts(out), drop, *parts(drop)]


@dataclass
class Done:
    """What the output files already hold, across the main and part files."""

    kept: dict[str, str | None]  # id of a kept conversation -> its resume key (None in files written before keys)
    dropped: dict[str, str | None]  # id of a dropped one -> its resume key
    users: set[str]  # the normalized user turns of the kept conversations (Magpie refuses repeats of them)
    repeats: set[str]  # the repeat keys of every line: a prompt answered before, under any id


def done_ids(out: Path) -> Done:
    """What the output `out`, its dropped file and their part files hold."""
    done = Done({}, {}, set(), set())
    drop = dropped_path(out)
    for path in all_files(out):
        records = read_records(path)
        (done.dropped if path in (drop, *parts(drop)) else done.kept).update(
            (str(r["id"]), r.get("key")) for r in records
        )
        done.repeats.update(r["repeat_key"] for r in records if r.get("repeat_key"))
        done.users.update(
            normalize(m["content"]) for r in records for m in r.get("messages", []) if m.get("role") == "user"
        )
    return done


def write(path: Path, record: dict[str, Any]) -> int:
    """Append one record as one line; returns the bytes written."""
    line = json.dumps(record, ensure_ascii=False)
    append_line(path, line)
    return len(line.encode()) + 1


def merge_parts(path: Path) -> int:
    """Append every part file's records whose id is not yet in `path`, then delete the parts.
    Returns the number of lines appended."""
    repair_tail(path)
    have = {str(r["id"]) for r in read_records(path)}
    lines = []
    found = parts(path)
    for part in found:
        for rec in read_records(part):
            if str(rec["id"]) not in have:
                have.add(str(rec["id"]))
                lines.append(json.dumps(rec, ensure_ascii=False) + "\n")
    if lines:
        with path.open("ab") as f:
            f.write("".join(lines).encode())
            f.flush()
            os.fsync(f.fileno())
    for part in found:
        part.unlink()
    return len(lines)
