"""Configs of `draftsmith prepare` and `draftsmith vocab`."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from draftsmith.config import DEFAULT_TARGET, CommandConfig

Format = Literal["auto", "sharegpt", "messages", "pairs", "turns", "prompts", "hf"]
LossOn = Literal["completion", "all"]


class PrepareConfig(CommandConfig):
    positional = "data"
    data: Path = Field(
        description="Conversations: a JSONL/JSON/parquet file, an HF dataset folder, hf:ORG/NAME[:SPLIT], or gsm8k or chitchat."
    )
    target: str = Field(
        DEFAULT_TARGET, description="Target whose tokenizer and chat template are used (weights are not loaded)."
    )
    out: Path = Field(description="Output folder for the tokenized dataset.")
    format: Format = Field(
        "auto",
        description="Record format (docs/prepare.md gives each one's fields); auto detects it from the first record.",
    )
    max_len: int = Field(2048, gt=0, description="Maximum tokens per sample.")
    length_policy: Literal["truncate", "drop"] = Field(
        "truncate", description="What to do with samples longer than --max-len."
    )
    chat_template: Path | None = Field(
        None, description="Jinja chat template file to use instead of the tokenizer's own (a base model has none)."
    )
    completion: bool = Field(
        False,
        description="Completion mode for base models: plain text or prompt/completion records, tokenized without a chat template.",
    )
    loss_on: LossOn = Field(
        "completion",
        description="Tokens that carry the loss: completion = the assistant turns (or the completion), all = every token.",
    )
    batch_size: int = Field(1024, gt=0, description="Conversations tokenized per batched tokenizer call.")
    overwrite: bool = Field(False, description="Replace an existing output folder.")


class VocabConfig(CommandConfig):
    positional = "dataset_dir"
    renamed = {"size": "draft_vocab_size"}  # the name train uses for the same number
    dataset_dir: Path = Field(description="Tokenized dataset folder from `draftsmith prepare`.")
    draft_vocab_size: int | None = Field(None, gt=0, description="Draft vocab size; default min(32000, target vocab).")
    out: Path = Field(description="Output file for the vocab mapping (safetensors with d2t and t2d).")
    overwrite: bool = Field(False, description="Replace an existing output file.")
