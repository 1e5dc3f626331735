"""Configs of `draftsmith quickstart` and `draftsmith pipeline`."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from draftsmith.config import CommandConfig


class QuickstartConfig(CommandConfig):
    out: Path = Field(Path("draftsmith-quickstart"), description="Output folder (reruns resume).")
    budget: Literal["small", "full"] | None = Field(
        None, description="small: minutes on a CPU; full: a real run on a GPU; default: full with a GPU, else small."
    )


class PipelineConfig(CommandConfig):
    positional = "pipeline_config"
    pipeline_config: Path = Field(description="YAML listing the stages to run and their options.")
    only: list[str] | None = Field(
        None,
        description="Run only these stages (by name); the others are not run, but their outputs still feed later stages.",
    )
    out: Path | None = Field(
        None,
        description="Root folder of the stages' outputs, beating the YAML's `out:`; default: the YAML's, else runs/<the YAML's name>.",
    )
    target: str | None = Field(
        None,
        description="Target of every stage that takes one, beating the YAML's `target:` but not a stage's own; default: the YAML's.",
    )
