"""Config of `draftsmith plan`."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from draftsmith.config import CommandConfig, ShardOption, TargetOptions
from draftsmith.draft.shape import DrafterShape


class PlanConfig(CommandConfig, TargetOptions, ShardOption, DrafterShape):
    """The drafter it sizes has `train`'s shape options (`DrafterShape`): plan with the ones you
    will train with."""

    positional = "dataset_dir"
    # one name per concept across commands and files
    renamed = {"layers": "aux_layer_ids", "ttt": "depth", "hidden_dir": "hidden"}
    dataset_dir: Path = Field(description="Tokenized dataset folder from `draftsmith prepare`.")
    hidden: Path | None = Field(None, description="Where the hidden-state store would go (checked for free space).")
    aux_layer_ids: list[int] | None = Field(
        None, description="Aux layer ids in draftsmith's convention; default [2, L//2, L-3]."
    )
    calibrate: bool = Field(True, description="Time a short forward on a few samples to estimate durations.")
    calibrate_tokens: int = Field(2048, gt=0, description="Tokens in the calibration batch.")
    token_budget: int = Field(65536, gt=0, description="Extraction batch size in tokens (as `extract --token-budget`).")
    epochs: float = Field(1.0, gt=0, description="Training epochs to plan for.")
    depth: int = Field(7, ge=1, description="Draft depth to plan training for: the training-time-test unroll steps.")
    batch_tokens: int = Field(8192, gt=0, description="Tokens per packed training row, as `train --batch-tokens`.")
    method: Literal["eagle3", "peagle", "dflash"] = Field(
        "eagle3", description="The drafter method to plan for, as `train --method`."
    )
    paper_settings: bool = Field(
        False, description="Plan for `train --paper-settings`: the method's paper's layers and target layers."
    )
