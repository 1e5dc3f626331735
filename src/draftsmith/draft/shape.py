"""The drafter's shape options, one definition for the commands that build or size a drafter:
`train` (the drafter it trains) and `plan` (the drafter whose memory and time it estimates), and
what its training costs that both read: the default TTT attention and the eager one's memory."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field, field_validator

if TYPE_CHECKING:  # annotations only: the configs that mix this in load without torch (a fast --help)
    import torch

    from draftsmith.draft.model import DrafterConfig


class DrafterShape(BaseModel):
    """Mixed into a command's config: its draft vocab, MLP width and depth options."""

    draft_vocab_size: int | None = Field(
        None,
        gt=0,
        description="Draft vocab size (train: when --vocab is not given), at most the target's vocab; default min(32000, vocab).",
    )
    intermediate_size: int | str | None = Field(
        None,
        description="Width of the drafter layer's MLP: a number (6144) or a multiple of the target's (4x); default: the target's.",
    )
    num_layers: int = Field(
        1,
        ge=1,
        description="Decoder layers in the drafter: the EAGLE-3 layer, then plain Llama layers on its hidden stream (SGLang serves one).",
    )

    @field_validator("intermediate_size", mode="before")
    @classmethod
    def _width(cls, v: Any) -> int | str | None:
        """A positive width (an int, or its digits), or a positive multiple of the target's: "4x", "1.5x"."""
        if v is None:
            return None
        s = str(v).strip()
        if s.isdigit() and int(s) > 0:
            return int(s)
        if re.fullmatch(r"\d+(\.\d+)?x", s) and float(s[:-1]) > 0:
            return s
        raise ValueError(f"{v!r}: give a width (6144) or a multiple of the target's MLP width (4x)")

    def mlp_width(self, target_width: int) -> int:
        """The drafter's MLP width for a target whose MLP is `target_width` wide."""
        if self.intermediate_size is None:
            return target_width
        if isinstance(self.intermediate_size, str):
            return round(float(self.intermediate_size[:-1]) * target_width)
        return self.intermediate_size

    def shaped(self, target_shape: DrafterConfig) -> DrafterConfig:
        """`target_shape` (`DrafterConfig.from_target`: one decoder layer of the target's) with
        this MLP width and number of decoder layers."""
        return replace(
            target_shape, intermediate_size=self.mlp_width(target_shape.intermediate_size), num_layers=self.num_layers
        )


def default_backend(device: torch.device) -> str:
    """Train's TTT attention under `--attention auto` (train/ttt.py): flex on GPU, eager elsewhere."""
    return "flex" if device.type == "cuda" else "eager"


def eager_attention_bytes(tokens: int, heads: int, depth: int, layers: int) -> int:
    """Peak memory of the eager backend's scores over one packed row of `tokens`: each layer's
    step keeps one fp32 [heads, T, T] softmax for backward, and the step being computed or
    differentiated ~3 more: 4-9 % under the peak RSS measured on CPU (`bench/eager_attention_memory.py`,
    experiments/LOG.md 2026-12-03 22:55); at the defaults on the embedded target (T 8192, K 7,
    9 heads) 24 GB."""
    return (depth * layers + 3) * heads * tokens * tokens * 4
