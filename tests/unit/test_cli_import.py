"""`draftsmith --help` stays fast: importing the CLI (every command's config) and printing any
command's help load no torch, which alone takes seconds to import. Each check runs in a fresh
interpreter, since this test process has torch loaded already."""

from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = ("torch", "transformers", "numpy", "safetensors")


def loaded_after(code: str) -> list[str]:
    """The heavy modules in `sys.modules` after running `code` in a fresh interpreter."""
    probe = f"{code}\nimport sys\nprint(' '.join(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return out.stdout.split()


def test_importing_the_cli_loads_no_torch():
    assert loaded_after("import draftsmith.cli") == []


@pytest.mark.parametrize("command", [None, "train", "eval", "plan", "pipeline"])
def test_help_loads_no_torch(command):
    argv = ["draftsmith", *([command] if command else []), "--help"]
    code = (
        "import contextlib, io, sys\n"
        f"sys.argv = {argv!r}\n"
        "from draftsmith.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    try:\n"
        "        main()\n"
        "    except SystemExit as e:\n"
        "        assert e.code == 0, e.code"
    )
    assert loaded_after(code) == []
