"""Config of `draftsmith plan`."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from draftsmith.config import DEFAULT_TARGET, SHARD_HELP, CommandConfig, Shard
from draftsmith.draft.shape import DrafterShape


class PlanConfig(CommandConfig, DrafterShape):
    """The drafter it sizes has `train`'s shape options (`DrafterShape`): plan with the ones you
    will train with."""

    positional = "dataset_dir"
    # one name per concept across commands and files
    renamed = {"layers": "aux_layer_ids", "ttt": "depth", "hidden_dir": "hidden"}
    dataset_dir: Path = Field(description="Tokenized dataset folder from `draftsmith prepare`.")
    target: str = Field(DEFAULT_TARGET, description="Target model: HF folder, .gguf file, or alias.")
    hidden: Path | None = Field(None, description="Where the hidden-state store would go (checked for free space).")
    aux_layer_ids: list[int] | None = Field(
        None, description="Aux layer ids in draftsmith's convention; default [2, L//2, L-3]."
    )
    device: str | None = Field(None, description="Device for the calibration run.")
    shard: Shard = Field("none", description=SHARD_HELP)
    dtype: str = Field("auto", description="Target dtype: auto (bf16 on GPU, fp32 on CPU), bf16, fp16, fp32.")
    calibrate: bool = Field(True, description="Time a short forward on a few samples to estimate durations.")
    calibrate_tokens: int = Field(2048, gt=0, description="Tokens in the calibration batch.")
    token_budget: int = Field(65536, gt=0, description="Extraction batch size in tokens (as `extract --token-budget`).")
    epochs: float = Field(1.0, gt=0, description="Training epochs to plan for.")
    depth: int = Field(7, ge=1, description="Draft depth to plan training for: the training-time-test unroll steps.")
