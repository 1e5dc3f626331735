"""Config of `draftsmith synth`."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from draftsmith.config import DEFAULT_TARGET, CommandConfig


class SynthConfig(CommandConfig):
    positional = "prompts"
    prompts: Path | None = Field(None, description="Prompts or conversations in any format `prepare` reads; omit with --magpie.")
    target: str = Field(DEFAULT_TARGET, description="Target model (local backend) or the model name to send (remote).")
    out: Path = Field(description="Output JSONL (OpenAI messages format, appended; reruns resume).")
    format: str = Field("auto", description="Input format, as for `prepare`.")
    magpie: int | None = Field(None, gt=0, description="Self-prompt N conversations (Magpie-style) instead of reading prompts.")
    turns: int = Field(1, ge=1, description="Magpie: user turns per conversation.")
    system: str | None = Field(None, description="System prompt to add to every conversation.")
    max_new_tokens: int = Field(512, gt=0, description="Tokens per generated turn.")
    temperature: float = Field(0.0, ge=0, description="Sampling temperature (0 = greedy).")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling.")
    seed: int = Field(0, description="Random seed.")
    limit: int | None = Field(None, gt=0, description="Use at most N prompts.")
    keep_thinking: bool = Field(True, description="Keep reasoning/thinking blocks in answers.")
    endpoint: str | None = Field(None, description="OpenAI-compatible server URL (remote backend), e.g. http://localhost:8000/v1.")
    concurrency: int = Field(16, ge=1, description="Remote backend: requests in flight.")
    timeout: float = Field(120.0, gt=0, description="Remote backend: seconds per request.")
    retries: int = Field(5, ge=0, description="Remote backend: retries with backoff per request.")
    batch_size: int = Field(32, ge=1, description="Local backend: prompts per generation batch.")
    device: str | None = Field(None, description="Device; default cuda when available.")
    dtype: str = Field("auto", description="Target dtype.")
