"""`draftsmith quickstart` (placeholder until issue #8 lands)."""

from pathlib import Path

from draftsmith.errors import NotImplementedYet


def run(cfg) -> Path:  # noqa: ANN001
    raise NotImplementedYet("draftsmith quickstart is not implemented yet (issue #8); nothing was done")
