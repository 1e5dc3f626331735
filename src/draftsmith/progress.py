"""Progress for long work: a live bar in a terminal, flushed log lines otherwise, and an
atomically updated `progress.json` that `draftsmith status` reads.

Rates count only the work done by this run: samples skipped because an earlier run finished
them are reported, never counted in samples/s or tok/s.

    with Progress("extract", out_dir, total=10000, unit="samples") as p:
        p.skip(143, tokens=...)          # already done by an earlier run (not in the rates)
        for batch in ...:
            p.advance(len(batch), tokens=n_tokens, bytes_written=nbytes)
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

from draftsmith.fsutil import atomic_write_json, human_bytes

PROGRESS_FILE = "progress.json"
FILE_INTERVAL = 1.0  # progress.json is rewritten at most this often (log lines: every `interval`)


def fmt_duration(seconds: float | None) -> str:
    if seconds is None or seconds != seconds or seconds == float("inf"):
        return "?"
    s = int(seconds)
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


class Progress:
    """Tracks done/total, skipped, errors, tokens and bytes for one stage run."""

    def __init__(
        self,
        stage: str,
        out_dir: Path | None,
        total: int,
        unit: str = "samples",
        interval: float = 10.0,
        bytes_projected: int | None = None,
        live: bool | None = None,
    ) -> None:
        self.stage, self.unit, self.total, self.interval = stage, unit, total, interval
        self.path = Path(out_dir) / PROGRESS_FILE if out_dir is not None else None
        self.bytes_projected = bytes_projected
        self.done = self.skipped = self.errors = 0
        self.skipped_tokens = 0
        self.tokens = 0
        self.bytes_written = 0
        self.counters: dict[str, float] = {}
        self.status = "running"
        self.message: str | None = None
        self.started = time.time()
        self._last_emit = self._last_file = 0.0
        self.live = sys.stderr.isatty() if live is None else live
        self._bar: Any = None

    # -- lifecycle ---------------------------------------------------------------------
    def __enter__(self) -> Progress:
        if self.live:
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeRemainingColumn
            from rich.progress import Progress as RichProgress

            self._bar = RichProgress(
                TextColumn(f"[bold]{self.stage}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeRemainingColumn(),
                TextColumn("{task.fields[info]}"),
                transient=False,
            )
            self._bar.start()
            self._task = self._bar.add_task(self.stage, total=self.total, info="")
        self._emit(force=True)
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if self.status == "running":
            if exc_type is None:
                self.status = "done"
            elif issubclass(exc_type, KeyboardInterrupt):
                self.status, self.message = "interrupted", "interrupted by the user"
            else:
                self.status, self.message = "failed", f"{exc_type.__name__}: {exc}"
        self._emit(force=True)
        if self._bar is not None:
            self._bar.stop()

    # -- updates -------------------------------------------------------------------------
    def skip(self, n: int, tokens: int = 0) -> None:
        """Count work an earlier run already finished (not part of this run's rates). Written out
        at once: a resumed run's progress.json starts at what is already saved, not at 0."""
        self.skipped += n
        self.skipped_tokens += tokens
        self._emit(force=True)

    def advance(self, n: int = 1, tokens: int = 0, bytes_written: int = 0, errors: int = 0, **counters: float) -> None:
        self.done += n
        self.tokens += tokens
        self.bytes_written += bytes_written
        self.errors += errors
        for k, v in counters.items():
            self.counters[k] = self.counters.get(k, 0) + v
        self._emit()

    def set(self, **counters: float) -> None:
        """Set gauges (loss, acc_0, GPU memory...) shown in the line and progress.json."""
        self.counters.update(counters)

    # -- reporting -----------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        elapsed = max(time.time() - self.started, 1e-9)
        rate = self.done / elapsed
        remaining = max(self.total - self.done - self.skipped, 0)
        eta = remaining / rate if rate > 0 else None
        return {
            "stage": self.stage,
            "status": self.status,
            "message": self.message,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "unit": self.unit,
            "total": self.total,
            "done": self.done,
            "skipped": self.skipped,
            "skipped_tokens": self.skipped_tokens,
            "errors": self.errors,
            "elapsed_s": round(elapsed, 2),
            "rate": round(rate, 4),
            "tokens": self.tokens,
            "tok_per_s": round(self.tokens / elapsed, 2),
            "eta_s": round(eta, 1) if eta is not None else None,
            "bytes_written": self.bytes_written,
            "bytes_projected": self.bytes_projected,
            "counters": self.counters,
            "started_at": self.started,
            "updated_at": time.time(),
        }

    def line(self, snap: dict[str, Any] | None = None) -> str:
        s = snap or self.snapshot()
        parts = [
            f"[{self.stage}] {s['done'] + s['skipped']}/{s['total']} done ({s['skipped']} skipped)",
            f"{s['rate']:.2f} {self.unit}/s",
        ]
        if s["tokens"]:
            parts.append(f"{s['tok_per_s']:.0f} tok/s")
        parts.append(f"ETA {fmt_duration(s['eta_s'])}")
        parts.append(f"errors {s['errors']}")
        if s["bytes_written"]:
            written = f"{human_bytes(s['bytes_written'])} written"
            if s["bytes_projected"]:
                written += f", ~{human_bytes(s['bytes_projected'])} projected"
            parts.append(written)
        parts += [f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in self.counters.items()]
        if s["status"] != "running":
            parts.append(s["status"] + (f": {s['message']}" if s["message"] else ""))
        return ", ".join(parts)

    def _emit(self, force: bool = False) -> None:
        """Rewrite progress.json (at most every FILE_INTERVAL s, so that `status` of a killed run
        lags by a second at most) and show the bar or log line (every `interval` s)."""
        now = time.time()
        write = self.path is not None and (force or now - self._last_file >= FILE_INTERVAL)
        show = force or now - self._last_emit >= (1.0 if self.live else self.interval)
        if not (write or show):
            return
        snap = self.snapshot()
        if write and self.path.parent.exists():
            self._last_file = now
            with contextlib.suppress(OSError):  # best effort: a full disk must not crash the stage
                atomic_write_json(self.path, snap, fsync=False)
        if not show:
            return
        self._last_emit = now
        if self._bar is not None:
            info = f"{snap['tok_per_s']:.0f} tok/s" if snap["tokens"] else f"{snap['rate']:.2f} {self.unit}/s"
            extra = " ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in self.counters.items())
            self._bar.update(self._task, completed=snap["done"] + snap["skipped"], info=f"{info} {extra}")
        else:
            print(self.line(snap), file=sys.stderr, flush=True)
