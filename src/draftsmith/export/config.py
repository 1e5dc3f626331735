"""Config of `draftsmith export`."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from draftsmith.config import CommandConfig


class ExportConfig(CommandConfig):
    positional = "drafter"
    positional_flag = True  # also `--drafter`, as eval spells it
    renamed = {"ckpt": "drafter", "speculative_tokens": "depth"}  # one name per concept across commands
    drafter: Path = Field(
        description="Drafter folder from `draftsmith train` (or an exported/third-party EAGLE-3 folder)."
    )
    format: Literal["eagle", "speculators"] = Field(
        "eagle", description="Output layout: eagle (vLLM and SGLang) or speculators (vLLM)."
    )
    engine: str = Field("vllm", description="Engine whose layer-id convention eagle_config uses: vllm or sglang.")
    sglang_release: str | None = Field(
        None, description="With --engine sglang: the SGLang release to serve with (default: the first that serves it)."
    )
    out: Path = Field(description="Output folder (written atomically).")
    include_embeddings: bool = Field(
        False,
        description="Also write embed_tokens.weight (engines otherwise share the target's); always with train --train-embedding.",
    )
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field(
        "auto", description="Weight dtype; auto keeps the checkpoint's."
    )
    eval_report: Path | None = Field(
        None,
        description="An eval report.json whose τ, speed-up and draft shape go into the model card and the serving commands.",
    )
    depth: int | None = Field(
        None,
        ge=1,
        description="Draft depth (chain length) for the speculators config and serving commands; default: the eval's, else trained.",
    )
    verifier: str | None = Field(
        None,
        description="Target name or path for the speculators config and serving commands; default the drafter's recorded target.",
    )
    verifier_architectures: list[str] | None = Field(
        None, description="Target architectures for the speculators config; default from its model_type."
    )
    source_convention: str | None = Field(
        None,
        description="Layer-id convention of a third-party drafter's config.json (vllm, sglang, modelopt, eagle); default: guessed.",
    )
    overwrite: bool = Field(False, description="Replace an existing output folder.")
