"""Config of `draftsmith synth`."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from draftsmith.config import DEFAULT_TARGET, SHARD_HELP, CommandConfig, Shard
from draftsmith.data.config import Format
from draftsmith.data.sources import describe as describe_sources


class SynthConfig(CommandConfig):
    positional = "prompts"
    prompts: Path | None = Field(
        None,
        description="Prompts or conversations in any format `prepare` reads (user turns are kept, assistant turns regenerated), or a named source; omit with --magpie or --mix. "
        + describe_sources(),
    )
    mix: Path | None = Field(
        None,
        description="A mix file (YAML): sources with a cap or weight each, per-task caps, duplicate removal, length and script filters, a seed (docs/synth.md). Writes mix.json next to the output.",
    )
    target: str = Field(
        DEFAULT_TARGET,
        description="Target model for the local backend. With --endpoint it only supplies the chat template (Magpie).",
    )
    out: Path = Field(
        description="Output JSONL (OpenAI messages format, appended; a rerun resumes). Give it its own folder: progress.json goes next to it."
    )
    format: Format = Field("auto", description="Input format, as for `prepare`.")
    chat_template: Path | None = Field(
        None, description="Jinja chat template file to use instead of the tokenizer's own (a base model has none)."
    )
    completion: bool = Field(
        False,
        description="Completion mode, for base models (local backend): each prompt is continued as raw text, no chat template; the output's user/assistant pairs are what `prepare --completion` reads.",
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
    seed: int = Field(0, description="Random seed; part of every output id, so several seeds can share one file.")
    limit: int | None = Field(None, gt=0, description="Use at most N prompts (after de-duplication).")
    keep_thinking: bool = Field(
        True, description="Keep <think>...</think> blocks in answers (--no-keep-thinking strips them)."
    )
    keep_unfinished: bool = Field(
        False, description="Keep turns cut by --max-new-tokens instead of ending the conversation there."
    )
    endpoint: str | None = Field(
        None, description="OpenAI-compatible server URL (remote backend), e.g. http://localhost:8000/v1."
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
    batch_size: int = Field(32, ge=1, description="Local backend: prompts per generation batch.")
    generator: Literal["auto", "engine", "hf"] = Field(
        "auto",
        description="Local backend: engine = draftsmith's static-KV engine, batched, decode step in a CUDA graph (Llama-family targets); hf = HF generate (any model); auto = engine (GPU or CPU) when the target passes its self-check (and its generation config has no repetition penalty or the like), else hf.",
    )
    cache: Literal["dynamic", "static"] = Field(
        "dynamic",
        description="Local backend with --generator hf: KV cache; static preallocates it and pads prompts to a multiple of 64.",
    )
    device: str | None = Field(
        None, description="Device; default cuda when available (cuda:LOCAL_RANK under torchrun)."
    )
    shard: Shard = Field("none", description="Local backend: " + SHARD_HELP + " Generates with HF generate.")
    dtype: str = Field("auto", description="Target dtype.")
