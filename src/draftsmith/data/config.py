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
        description="Conversations: a JSONL/JSON/parquet file, a local HF dataset folder, hf:ORG/NAME[:SPLIT] (the hf extra) or a named source with answers (gsm8k, chitchat). A synth --mix output carries its mix.json's sources and licenses into dataset.json."
    )
    target: str = Field(
        DEFAULT_TARGET, description="Target whose tokenizer and chat template are used (weights are not loaded)."
    )
    out: Path = Field(description="Output folder for the tokenized dataset.")
    format: Format = Field(
        "auto",
        description="Record format: sharegpt (conversations/from/value), messages (OpenAI), pairs "
        "(prompt/response, question/answer, instruction/output), turns (MT-bench), prompts, or hf "
        "(a saved HF dataset folder, records auto-detected); 'auto' detects it from the first record.",
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
        description="Completion mode, for base models: no chat template at all; each record is plain text ('text') or a prompt/completion pair, tokenized as prompt + completion with the tokenizer's own special tokens (as `eval --completion` prompts).",
    )
    loss_on: LossOn = Field(
        "completion",
        description="Tokens that carry the loss: 'completion' = the assistant turns (chat) or the completion (--completion; all of a plain text), 'all' = every token.",
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
