"""Progress rates count only this run's work; status reads progress.json and process liveness."""

import json
import os
import subprocess
import sys
import time

from typer.testing import CliRunner

from draftsmith.cli import app
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
