"""Config of `draftsmith export`."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from draftsmith.config import CommandConfig


class ExportConfig(CommandConfig):
    positional = "ckpt"
    ckpt: Path = Field(description="Drafter folder from `draftsmith train` (or an exported/imported EAGLE-3 folder).")
    format: Literal["eagle", "speculators"] = Field("eagle", description="Output layout.")
    engine: str = Field("vllm", description="Engine whose layer-id convention the config uses: vllm or sglang.")
    out: Path = Field(description="Output folder.")
    include_embeddings: bool = Field(False, description="Also write embed_tokens.weight.")
    eval_report: Path | None = Field(None, description="An eval report.json whose tau goes into the model card.")
    overwrite: bool = Field(False, description="Replace an existing output folder.")
