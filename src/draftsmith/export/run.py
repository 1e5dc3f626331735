"""`draftsmith export` (placeholder until issue #7 lands)."""

from pathlib import Path

from draftsmith.errors import NotImplementedYet


def run(cfg) -> Path:  # noqa: ANN001
    raise NotImplementedYet("draftsmith export is not implemented yet (issue #7); nothing was done")
