"""`draftsmith vocab` (placeholder until issue #2 lands)."""

from pathlib import Path

from draftsmith.errors import NotImplementedYet


def run(cfg) -> Path:  # noqa: ANN001
    raise NotImplementedYet("draftsmith vocab is not implemented yet (issue #2); nothing was done")
