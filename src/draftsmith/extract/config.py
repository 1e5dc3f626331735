"""Config of `draftsmith extract`."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from draftsmith.config import CommandConfig, ShardOption, TargetOptions


class ExtractConfig(CommandConfig, TargetOptions, ShardOption):
    positional = "dataset_dir"
    common = (
        *("dataset_dir", "target", "out", "aux_layer_ids", "force", "plan", "device", "dtype", "shard"),
        *("token_budget", "engine", "tensor_parallel_size"),
    )
    renamed = {"layers": "aux_layer_ids"}  # one name with the store and drafter.json
    dataset_dir: Path = Field(description="Tokenized dataset folder from `draftsmith prepare`.")
    out: Path = Field(description="Output folder of the hidden-state store.")
    aux_layer_ids: list[int] | None = Field(
        None,
        description="Aux layer ids in draftsmith's convention (id k = hidden state entering layer k); default [2, L//2, L-3].",
    )
    force: bool = Field(False, description="Start even when the disk cannot hold the projected store.")
    plan: bool = Field(
        False,
        description="Only print the store's projected size against the free space at --out, loading no weights, writing nothing.",
    )
    token_budget: int = Field(65536, gt=0, description="Tokens per forward batch (length-bucketed, padding counted).")
    writers: int = Field(4, gt=0, description="Writer threads.")
    check_every: int = Field(
        200, ge=0, description="Re-check one sample against a plain reference forward every N samples (0: never)."
    )
    check_tol: float | None = Field(
        None, gt=0, description="Relative-error tolerance of the re-check; default 1e-3 for fp32, 5e-2 for bf16/fp16."
    )
    max_errors: int = Field(10, ge=0, description="Stop after this many validation failures.")
    staging_dir: Path | None = Field(
        None, description="A folder to write files in first (such as /dev/shm), before they move into the store."
    )
    engine: Literal["transformers", "vllm"] = Field(
        "transformers",
        description="What runs the target: transformers in this process, or vLLM in a worker process (the vllm extra; docs/extract.md).",
    )
    prefix_caching: bool = Field(
        False,
        description="--engine vllm: let vLLM reuse cached prefixes between samples (rows == tokens is still checked for every sample).",
    )
    tensor_parallel_size: int = Field(
        1, gt=0, description="--engine vllm: GPUs the target is split over with tensor parallelism."
    )
    expert_parallel: bool = Field(
        False, description="--engine vllm: spread a MoE target's experts over the GPUs (vLLM's enable_expert_parallel)."
    )
    engine_memory: float = Field(
        0.85,
        gt=0,
        le=1,
        description="--engine vllm on GPU: the fraction of each GPU's memory vLLM may take (its gpu_memory_utilization).",
    )
    engine_chunk: int = Field(
        256,
        gt=0,
        description="--engine vllm: samples per vLLM generate call; at most about two chunks of request files wait on disk.",
    )
