"""`draftsmith train` (placeholder until issue #5 lands)."""

from pathlib import Path

from draftsmith.errors import NotImplementedYet


def run(cfg) -> Path:  # noqa: ANN001
    raise NotImplementedYet("draftsmith train is not implemented yet (issue #5); nothing was done")
