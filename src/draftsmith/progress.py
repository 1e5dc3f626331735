"""Progress for long work: a live bar in a terminal, flushed log lines otherwise, and an
atomically updated `progress.json` that `draftsmith status` reads.

Rates count only the work done by this run: samples skipped because an earlier run finished
them are reported, never counted in samples/s or tok/s. Two rates are kept: the current one,
over about the last minute (`rate_now`, `tok_per_s_now`: what the line shows while the stage runs,
and what the ETA is computed from), and the run's average since it started (`rate`, `tok_per_s`),
which counts loading, compilation and validation pauses too. A training run that compiles for
two minutes and then does 12 steps/s shows about 12 steps/s seconds after, not the average.
`ready()` says a setup is over (a vLLM engine up after a minute): the current rate starts there.

    with Progress("extract", out_dir, total=10000, unit="samples") as p:
        p.skip(143, tokens=...)          # already done by an earlier run (not in the rates)
        for batch in ...:
            p.advance(len(batch), tokens=n_tokens, bytes_written=nbytes)
"""

from __future__ import annotations

import collections
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
RATE_WINDOW = 60.0  # seconds: the current rate is measured over about the last minute
MIN_SPAN = 5.0  # seconds: the least span a current rate is measured over (else the span before the window)


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
        # (time, done, tokens) at most every FILE_INTERVAL s: the last minute's, and the one before it
        self._marks: collections.deque[tuple[float, int, int]] = collections.deque([(self.started, 0, 0)])
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

    def ready(self) -> None:
        """The setup before the work is over (an engine started): the current rate and the ETA
        count from now, not from a start that includes it; the average still does."""
        now = time.time()
        self._marks = collections.deque([(now, self.done, self.tokens)])
        self._emit(force=True)

    def set(self, **counters: float) -> None:
        """Set gauges (loss, acc_0, GPU memory...) shown in the line and progress.json."""
        self.counters.update(counters)

    # -- reporting -----------------------------------------------------------------------
    def _mark(self, now: float) -> None:
        """Record (now, done, tokens) for the current rate, keeping the marks of the last
        RATE_WINDOW seconds and the newest one before them."""
        if now - self._marks[-1][0] >= FILE_INTERVAL:
            self._marks.append((now, self.done, self.tokens))
        while len(self._marks) > 1 and self._marks[1][0] <= now - RATE_WINDOW:
            self._marks.popleft()

    def _current(self, now: float) -> tuple[float, float]:
        """Work a second and tokens a second over about the last RATE_WINDOW seconds: from the
        oldest mark inside the window, or, where that spans less than MIN_SPAN seconds (just after
        a long pause: a compilation, a validation), from the newest mark before it."""
        base = self._marks[0]
        inside = self._marks[1] if len(self._marks) > 1 else base
        if inside[0] >= now - RATE_WINDOW and now - inside[0] >= MIN_SPAN:
            base = inside
        span = max(now - base[0], 1e-9)
        return (self.done - base[1]) / span, (self.tokens - base[2]) / span

    def snapshot(self) -> dict[str, Any]:
        now = time.time()
        elapsed = max(now - self.started, 1e-9)
        rate = self.done / elapsed
        rate_now, tok_now = self._current(now)
        remaining = max(self.total - self.done - self.skipped, 0)
        eta = remaining / rate_now if rate_now > 0 else None
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
            "rate_now": round(rate_now, 4),
            "tokens": self.tokens,
            "tok_per_s": round(self.tokens / elapsed, 2),
            "tok_per_s_now": round(tok_now, 2),
            "eta_s": round(eta, 1) if eta is not None else None,
            "bytes_written": self.bytes_written,
            "bytes_projected": self.bytes_projected,
            "counters": self.counters,
            "started_at": self.started,
            "updated_at": time.time(),
        }

    def line(self, snap: dict[str, Any] | None = None) -> str:
        s = snap or self.snapshot()
        running = s["status"] == "running"  # running: the current rates, then the run's average
        rate, tok = (s["rate_now"], s["tok_per_s_now"]) if running else (s["rate"], s["tok_per_s"])
        parts = [f"[{self.stage}] {s['done'] + s['skipped']}/{s['total']} done ({s['skipped']} skipped)"]
        parts.append(f"{rate:.2f} {self.unit}/s" + (f", {tok:.0f} tok/s" if s["tokens"] else ""))
        if running and s["done"]:
            parts[-1] += f" (average {s['rate']:.2f} {self.unit}/s)"
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
        self._mark(now)
        snap = self.snapshot()
        if write and self.path.parent.exists():
            self._last_file = now
            with contextlib.suppress(OSError):  # best effort: a full disk must not crash the stage
                atomic_write_json(self.path, snap, fsync=False)
        if not show:
            return
        self._last_emit = now
        if self._bar is not None:
            info = f"{snap['tok_per_s_now']:.0f} tok/s" if snap["tokens"] else f"{snap['rate_now']:.2f} {self.unit}/s"
            extra = " ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in self.counters.items())
            self._bar.update(self._task, completed=snap["done"] + snap["skipped"], info=f"{info} {extra}")
        else:
            print(self.line(snap), file=sys.stderr, flush=True)
