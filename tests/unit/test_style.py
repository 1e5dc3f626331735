"""The house style is checked, not hoped for: `ruff check` and `ruff format --check`, as
pyproject.toml configures them, pass on the whole repository (ruff comes with the test extra)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUFF = shutil.which("ruff")


@pytest.mark.skipif(RUFF is None, reason="ruff is not installed: pip install -e '.[test]' installs it")
@pytest.mark.parametrize(("args", "fix"), [(["check"], "ruff check --fix ."), (["format", "--check"], "ruff format .")])
def test_ruff_passes(args: list[str], fix: str) -> None:
    res = subprocess.run([RUFF, *args, "."], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, f"ruff {' '.join(args)}:\n{res.stdout[-4000:]}{res.stderr[-2000:]}\nfix: {fix}"
