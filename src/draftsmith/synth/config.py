"""Config of `draftsmith synth`."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from draftsmith.config import DEFAULT_TARGET, CommandConfig, ShardOption, TargetOptions
from draftsmith.data.config import Format


class SynthConfig(CommandConfig, TargetOptions, ShardOption):
    positional = "prompts"
    common = (
        *("prompts", "mix", "target", "out", "format", "magpie", "turns", "system", "max_new_tokens", "temperature"),
        *("seed", "limit", "endpoint", "model", "concurrency", "batch_size", "device", "dtype", "shard"),
    )
    prompts: Path | None = Field(
        None,
        description="Prompts or conversations (user turns kept), or a named source (docs/synth.md); omit with --magpie or --mix.",
    )
    mix: Path | None = Field(
        None,
        description="A mix file (YAML) of sources, caps, weights and filters (docs/synth.md); writes mix.json in OUT.synth/.",
    )
    target: str = Field(
        DEFAULT_TARGET,
        description="Target model (HF folder, .gguf file, or alias); with --endpoint, only its chat template.",
    )
    out: Path = Field(
        description="Output JSONL (OpenAI messages; a rerun resumes); progress.json, run.yaml and mix.json go in OUT.synth/ beside it."
    )
    format: Format = Field("auto", description="Input format, as for `prepare`.")
    chat_template: Path | None = Field(
        None, description="Jinja chat template file to use instead of the tokenizer's own (a base model has none)."
    )
    completion: bool = Field(
        False,
        description="Completion mode for base models (local backend): continue each prompt as raw text, without a chat template.",
    )
    magpie: int | None = Field(
        None, gt=0, description="Self-prompt N conversations (Magpie-style) instead of reading prompts."
    )
    turns: int = Field(1, ge=1, description="Magpie: user turns per conversation.")
    system: str | None = Field(
        None, description="System prompt for every conversation (sources that have one keep theirs)."
    )
    max_new_tokens: int = Field(512, gt=0, description="Tokens per generated turn.")
    temperature: float = Field(0.0, ge=0, description="Sampling temperature of the answers (0 = greedy).")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling.")
    top_k: int = Field(0, ge=0, description="Top-k sampling (0 = off).")
    magpie_temperature: float = Field(1.0, gt=0, description="Magpie: temperature of the self-prompted user turns.")
    magpie_top_p: float = Field(1.0, gt=0, le=1, description="Magpie: nucleus sampling of the user turns.")
    magpie_max_tokens: int | None = Field(
        None, gt=0, description="Magpie: the most tokens of a self-prompted user turn; default --max-new-tokens."
    )
    seed: int = Field(0, description="Random seed; part of every output id, so several seeds can share one file.")
    limit: int | None = Field(None, gt=0, description="Use at most N prompts (after de-duplication).")
    keep_thinking: bool = Field(
        True, description="Keep <think>...</think> blocks in answers (--no-keep-thinking strips them)."
    )
    keep_unfinished: bool = Field(
        False, description="Keep turns cut by --max-new-tokens instead of ending the conversation there."
    )
    endpoint: str | None = Field(
        None, description="OpenAI-compatible server URL of the remote backend, such as http://localhost:8000/v1."
    )
    model: str | None = Field(
        None, description="Remote backend: model name to request; default the first one the server lists."
    )
    concurrency: int = Field(16, ge=1, description="Remote backend: requests in flight.")
    timeout: float = Field(120.0, gt=0, description="Remote backend: seconds per request.")
    retries: int = Field(5, ge=0, description="Remote backend: retries per request, with exponential backoff.")
    backoff: float = Field(
        1.0, ge=0, description="Remote backend: seconds before the first retry (doubled each retry, at most 30)."
    )
    batch_size: int = Field(
        32, ge=1, description="Local backend: prompts per generation batch (vllm: sequences at once)."
    )
    generator: Literal["auto", "engine", "hf", "vllm"] = Field(
        "auto",
        description="Local backend: engine (draftsmith's own), hf (HF generate, any model), vllm (vLLM's engine) or auto (docs/synth.md).",
    )
    cache: Literal["dynamic", "static"] = Field(
        "dynamic",
        description="Local backend with --generator hf: KV cache; static preallocates it and pads prompts to a multiple of 64.",
    )
    shrink_batches: bool = Field(
        False,
        description="Local engine: a batch goes on over its running rows once half have stopped; sampled draws change.",
    )
    refill_batches: bool = Field(
        False,
        description="Local engine: rows whose answers end take the next prompts mid-batch (4 answers' slots a row); off until measured.",
    )
    fuse_target: bool | None = Field(
        None,
        description="Local engine: the target's q/k/v and gate/up as one product each (as eval's); default on for GPU.",
    )
    compile_target: bool = Field(
        False,
        description="Local engine on a GPU: each decode graph compiled, one decoder layer's step for all layers; off until measured.",
    )
    flash_decode: bool | None = Field(
        None,
        description="Local engine: decode attention by FlashAttention's varlen kernel, no mask; default on where it runs (GPU, bf16/fp16).",
    )
