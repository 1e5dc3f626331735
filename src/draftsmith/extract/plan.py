"""`draftsmith plan` (placeholder until issue #4 lands)."""

from pathlib import Path

from draftsmith.errors import NotImplementedYet


def run(cfg) -> Path:  # noqa: ANN001
    raise NotImplementedYet("draftsmith plan is not implemented yet (issue #4); nothing was done")
