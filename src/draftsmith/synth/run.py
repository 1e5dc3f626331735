"""`draftsmith synth` (placeholder until issue #3 lands)."""

from pathlib import Path

from draftsmith.errors import NotImplementedYet


def run(cfg) -> Path:  # noqa: ANN001
    raise NotImplementedYet("draftsmith synth is not implemented yet (issue #3); nothing was done")
