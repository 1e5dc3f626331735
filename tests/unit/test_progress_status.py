"""Progress rates count only this run's work; status reads progress.json and process liveness."""

import json
import os
import subprocess
import sys
import time

import pytest
from typer.testing import CliRunner

from draftsmith.cli import app
from draftsmith.errors import UserError
from draftsmith.fsutil import output_lock
from draftsmith.progress import Progress


def test_rates_exclude_skipped_work(tmp_path, capsys):
    with Progress("extract", tmp_path, total=100, interval=0, live=False) as p:
        p.skip(90, tokens=90_000)
        time.sleep(0.05)
        p.advance(5, tokens=500, bytes_written=1000)
    snap = json.loads((tmp_path / "progress.json").read_text())
    assert snap["done"] == 5 and snap["skipped"] == 90 and snap["status"] == "done"
    assert snap["tokens"] == 500  # skipped tokens never inflate tok/s
    assert snap["skipped_tokens"] == 90_000  # but they are reported
    assert snap["rate"] < 5 / 0.05 + 1
    err = capsys.readouterr().err
    assert "[extract] 95/100 done (90 skipped)" in err  # flushed log line, not a bar


def test_status_reports_dead_process_and_fields(tmp_path):
    stage = tmp_path / "store"
    stage.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    with Progress("extract", stage, total=10, live=False) as p:
        p.advance(3, tokens=300)
        snap = p.snapshot()
    snap.update(status="running", pid=dead.pid)
    (stage / "progress.json").write_text(json.dumps(snap))
    r = CliRunner().invoke(app, ["status", str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert "extract" in r.output and "3/10" in r.output and "dead" in r.output
    snap["pid"] = os.getpid()
    (stage / "progress.json").write_text(json.dumps(snap))
    assert "alive" in CliRunner().invoke(app, ["status", str(stage)]).output


def test_status_on_a_folder_without_progress(tmp_path):
    r = CliRunner().invoke(app, ["status", str(tmp_path)])
    assert r.exit_code == 2 and "no progress.json" in r.output


def test_status_finds_a_stage_still_working_in_its_temporary_folder(tmp_path):
    """eval and prepare build their folder under a hidden temporary name until they finish."""
    work = tmp_path / ".eval.abc123.tmp"
    work.mkdir()
    with Progress("eval", work, total=4, unit="questions", live=False) as p:
        p.advance(1)
    r = CliRunner().invoke(app, ["status", str(tmp_path / "eval")])
    assert r.exit_code == 0, r.output
    assert "1/4 questions" in r.output and "in progress" in r.output


def test_a_resumed_run_reports_what_is_saved_at_once(tmp_path):
    """Issue 16 item 10: a rerun that resumes 27 of 40 said 0/40 until its first update."""
    with Progress("extract", tmp_path, total=40, interval=3600, live=False) as p:
        p.skip(27)
        snap = json.loads((tmp_path / "progress.json").read_text())
        assert (snap["done"], snap["skipped"]) == (0, 27)
        r = CliRunner().invoke(app, ["status", str(tmp_path)])
        assert r.exit_code == 0 and "27/40 samples (27 skipped by resume)" in r.output, r.output


def test_progress_json_keeps_up_between_log_lines(tmp_path, monkeypatch, capsys):
    """A killed run's progress.json lags by FILE_INTERVAL (1 s) at most, not by the 10 s between
    log lines: status then shows what was saved, not 0."""
    import draftsmith.progress as progress

    monkeypatch.setattr(progress, "FILE_INTERVAL", 0.0)
    with Progress("extract", tmp_path, total=40, interval=3600, live=False) as p:
        for _ in range(27):
            p.advance(1)
        assert json.loads((tmp_path / "progress.json").read_text())["done"] == 27
        assert capsys.readouterr().err.count("[extract]") == 1  # the log line waits for its interval


def test_the_current_rate_leaves_a_compilation_behind(tmp_path, monkeypatch, capsys):
    """A stage that compiles for 100 s and then runs 10 steps/s shows 10 steps/s and an ETA at
    that rate once its last minute is past the pause, not the run's average (a lease of
    2026-12-05 read 2.5 steps/s off such lines while training ran at 12): the average stays in
    progress.json and the line, and becomes the rate once the stage is done."""
    import draftsmith.progress as progress

    clock = [1000.0]
    monkeypatch.setattr(progress.time, "time", lambda: clock[0])
    with Progress("train", tmp_path, total=3001, unit="steps", interval=10, live=False) as p:
        clock[0] += 100  # compiling: no step
        p.advance(1, tokens=8192)
        for _ in range(1000):  # 10 steps a second for 100 s
            clock[0] += 0.1
            p.advance(1, tokens=8192)
        snap = json.loads((tmp_path / "progress.json").read_text())
        assert snap["rate_now"] == pytest.approx(10, rel=0.02) and snap["tok_per_s_now"] == pytest.approx(
            81920, rel=0.02
        )
        assert snap["rate"] == pytest.approx(1001 / 200, rel=0.01)  # the average counts the pause
        assert snap["eta_s"] == pytest.approx(2000 / 10, rel=0.02)
        line = capsys.readouterr().err.strip().splitlines()[-1]
        assert "10.00 steps/s, 81920 tok/s (average 4." in line and "ETA 3m" in line, line  # the last line: step 910
        r = CliRunner().invoke(app, ["status", str(tmp_path)])
        assert "rate (last minute)" in r.output and "10.0" in r.output, r.output
        clock[0] += 90  # a validation pause: the current rate shows the stall
        p.advance(1, tokens=8192)
        assert p.snapshot()["rate_now"] < 0.2  # about 11 steps (those of the last mark on) in 91 s
    done = json.loads((tmp_path / "progress.json").read_text())
    assert done["status"] == "done" and "(average" not in capsys.readouterr().err.strip().splitlines()[-1]


def test_a_setup_marked_ready_leaves_the_current_rate_and_eta(tmp_path, monkeypatch):
    """A vLLM engine that takes 70 s to start, then captures 10 samples a second: once `ready()`
    is called the first samples' rate and ETA are the capture's (the lease of 2026-12-05 22:56 read
    "1/600 done, 0.02 samples/s, ETA 10h17m" off vLLM's first sample); the average counts the start."""
    import draftsmith.progress as progress

    clock = [1000.0]
    monkeypatch.setattr(progress.time, "time", lambda: clock[0])
    with Progress("extract", tmp_path, total=600, live=False) as p:
        clock[0] += 70  # the engine starting
        p.ready()
        for _ in range(20):
            clock[0] += 0.1
            p.advance(1, tokens=200)
        snap = p.snapshot()
    assert snap["rate_now"] == pytest.approx(10, rel=0.02) and snap["tok_per_s_now"] == pytest.approx(2000, rel=0.02)
    assert snap["eta_s"] == pytest.approx(580 / 10, rel=0.02)
    assert snap["rate"] == pytest.approx(20 / 72, rel=0.01)  # the average counts the start


def test_a_rerun_loading_the_target_is_starting_not_dead(tmp_path):
    """Issue 16 items 9-10: while a rerun holds the output lock but has not reported yet (it is
    loading the model), status says so instead of 'dead', which would invite a second run."""
    stage = tmp_path / "store"
    stage.mkdir()
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    with Progress("extract", stage, total=40, live=False) as p:
        p.advance(27)
        snap = p.snapshot()
    (stage / "progress.json").write_text(json.dumps({**snap, "status": "running", "pid": gone.pid}))  # killed
    assert "dead" in CliRunner().invoke(app, ["status", str(stage)]).output
    code = f"from draftsmith.fsutil import output_lock\nwith output_lock({str(stage)!r}):\n print('locked', flush=True)\n input()"
    rerun = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert rerun.stdout.readline().strip() == "locked"
        r = CliRunner().invoke(app, ["status", str(stage)])
        assert r.exit_code == 0 and f"starting (pid {rerun.pid} holds the output lock" in r.output, r.output
        assert "dead" not in r.output
        with pytest.raises(UserError, match=f"being written by another draftsmith process \\(pid {rerun.pid}\\)"):
            with output_lock(stage):
                pass
    finally:
        rerun.communicate("\n", timeout=30)
    assert "dead" in CliRunner().invoke(app, ["status", str(stage)]).output  # the lock went with its process
