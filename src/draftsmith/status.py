"""`draftsmith status DIR`: what any stage's output folder says about its run.

Reads the `progress.json` that every long-running stage keeps up to date, in DIR and in its
immediate subfolders (a pipeline or quickstart folder holds one per stage; a synth output's is in
`OUT.synth/` beside it, and `status OUT.jsonl` reads that), and tells whether
the process that wrote it is still alive, or whether a new run of the stage, which holds the
folder's output lock (`fsutil.output_lock`), is starting there.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

from pydantic import Field
from rich.console import Console
from rich.table import Table

from draftsmith.config import CommandConfig
from draftsmith.data.sources import SYNTH_FOLDER, synth_folder
from draftsmith.errors import UserError
from draftsmith.fsutil import human_bytes, lock_holder
from draftsmith.progress import PROGRESS_FILE, fmt_duration


class StatusConfig(CommandConfig):
    positional = "dir"
    dir: Path = Field(
        description="A stage's output folder (or a pipeline folder holding several), or synth's output file."
    )


def process_state(snap: dict, folder: Path) -> str:
    """'alive', 'dead', 'starting' (a new run holds the folder's output lock but has not written
    its progress yet: it is loading the target), or 'running on HOST' for a stage written elsewhere."""
    holder = lock_holder(folder)
    if holder is not None and (snap.get("status") != "running" or holder != str(snap.get("pid"))):
        return (
            f"starting (pid {holder} holds the output lock: loading the target or resuming; the counts below "
            "are the last run's until it reports)"
        )
    if snap.get("status") != "running":
        return snap.get("status", "?")
    if snap.get("host") != socket.gethostname():
        return f"running on {snap.get('host')} (cannot check)"
    if folder.name.endswith(".tmp"):  # an atomic stage's build folder: those stages do not resume
        dead = "dead (process gone; this temporary folder is left over: the next run of the same command removes it and starts over)"
    else:
        dead = "dead (process gone: rerun the same command to resume)"
    try:
        os.kill(int(snap["pid"]), 0)
    except ProcessLookupError:
        return dead
    except PermissionError:
        pass
    started = snap.get("started_at") or snap.get("updated_at", 0) - snap.get("elapsed_s", 0)
    if process_started(int(snap["pid"])) > started + 5:  # the pid now names a later process
        return dead.replace("process gone", f"process gone, pid {snap['pid']} is another process now")
    return "alive"


def process_started(pid: int) -> float:
    """When process `pid` started (seconds since the epoch, from /proc), or 0 where it cannot be read."""
    try:
        ticks = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
        boot = next(
            float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines() if line.startswith("btime")
        )
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return 0.0


def find_progress(root: Path) -> list[Path]:
    """progress.json in `root` and its subfolders. Stages that publish their folder atomically
    (prepare, eval) work in a hidden `.NAME.*.tmp` sibling until they finish: look there too. A
    synth output keeps its own in `OUT.synth/` beside it (`root` may name the output file, or a
    pipeline folder whose `synth/` holds it)."""
    if root.is_file():
        root = synth_folder(root)
    found = [root / PROGRESS_FILE] if (root / PROGRESS_FILE).exists() else []
    found += sorted(root.glob(f"*/{PROGRESS_FILE}")) + sorted(root.glob(f".*.tmp/{PROGRESS_FILE}"))
    found += sorted(root.glob(f"*/*{SYNTH_FOLDER}/{PROGRESS_FILE}"))
    found += sorted(root.parent.glob(f".{root.name}.*.tmp/{PROGRESS_FILE}"))
    return found


NUMBERS = ("total", "done", "skipped", "errors", "rate", "updated_at")


def read_progress(path: Path) -> dict:
    """A progress.json, or a UserError naming it when it is not one (cut short, overwritten)."""
    try:
        snap = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:  # not JSON, or not UTF-8
        snap, why = None, str(e)
    else:
        why = f"needs numbers {', '.join(NUMBERS)} and a stage name"
    if not (
        isinstance(snap, dict)
        and isinstance(snap.get("stage"), str)
        and all(isinstance(snap.get(k), int | float) for k in NUMBERS)
    ):
        raise UserError(
            f"{path}: not a readable progress file ({why}); the stage rewrites it while it runs: "
            "rerun the stage's command, or delete the file"
        )
    return snap


def run(cfg: StatusConfig) -> Path:
    root = Path(cfg.dir)
    files = find_progress(root)
    if not root.exists() and not files:
        raise UserError(f"{root}: no such folder")
    if not files:
        raise UserError(f"{root}: no {PROGRESS_FILE} here or in its subfolders; is it a draftsmith stage's output?")
    console = Console()
    corrupt: list[str] = []
    for f in files:
        try:
            s = read_progress(f)
        except UserError as e:
            corrupt.append(str(e))
            continue
        disk = human_bytes(s["bytes_written"]) if s.get("bytes_written") else "-"
        if s.get("bytes_projected"):
            disk += f" of ~{human_bytes(s['bytes_projected'])} projected"
        state = process_state(s, f.parent)
        state += f": {s['message']}" if s.get("message") and state == s.get("status") else ""
        running, unit = s.get("status") == "running", s.get("unit", "")
        current = (  # while the stage runs; a progress.json written before there was one has none
            {"rate (last minute)": f"{s['rate_now']:.2f} {unit}/s, {s.get('tok_per_s_now', 0):.0f} tok/s"}
            if running and isinstance(s.get("rate_now"), int | float)
            else {}
        )
        rows = {
            "state": state,
            "done": f"{s['done'] + s['skipped']}/{s['total']} {unit} ({s['skipped']} skipped by resume)",
            **current,
            "rate (this run's average)": f"{s['rate']:.2f} {unit}/s, {s.get('tok_per_s', 0):.0f} tok/s",
            "ETA": fmt_duration(s.get("eta_s")) if running else "-",
            "errors": str(s["errors"]),
            "disk": disk,
            "elapsed": fmt_duration(s.get("elapsed_s")),
            "updated": f"{fmt_duration(time.time() - s['updated_at'])} ago",
            **{k: (f"{v:.4g}" if isinstance(v, float) else str(v)) for k, v in s.get("counters", {}).items()},
        }
        where = (
            str(f.parent) if f.parent == root or not f.parent.is_relative_to(root) else str(f.parent.relative_to(root))
        )
        if f.parent.name.endswith(".tmp"):
            where += " (left by a killed run)" if state.startswith("dead") else " (in progress, published when done)"
        table = Table(title=f"[bold]{s['stage']}[/bold]  {where}", show_header=False, title_justify="left")
        table.add_column("field", style="bold")
        table.add_column("value", overflow="fold")
        for k, v in rows.items():
            table.add_row(k, v)
        console.print(table)
    if corrupt:
        raise UserError("\n".join(corrupt))
    return root
