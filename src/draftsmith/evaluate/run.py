"""`draftsmith eval` (placeholder until issue #6 lands)."""

from pathlib import Path

from draftsmith.errors import NotImplementedYet


def run(cfg) -> Path:  # noqa: ANN001
    raise NotImplementedYet("draftsmith eval is not implemented yet (issue #6); nothing was done")
