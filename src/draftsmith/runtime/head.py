"""The target's output path, as training's teacher uses it: logits = transform(final @ Wᵀ + b).

`final` is the language model's final hidden state (after the final norm: what `capture` and the
store hold), W [V, H] and b [V] the output embedding's weight and bias, and `transform` what the
model's own forward does to the lm_head's output, read from the config fields its forward reads:
  - Granite divides by `logits_scaling`;
  - Cohere multiplies by `logit_scale`;
  - Gemma-2/3 soft-cap at `final_logit_softcapping`: cap·tanh(z/cap).
Each is elementwise and monotonic, so the teacher on the draft vocab is the transform of the
linear part on the draft rows, and the argmax of the linear part is the model's argmax.

A re-derivation can drift from the model's code (a family or a config field not known here), so
`check_output_head` holds it against `model(ids).logits` on one short forward; `train` refuses a
target whose head does not match, naming the model class: never a silently wrong teacher.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import nn

from draftsmith.errors import UserError
from draftsmith.runtime.engine import softcap
from draftsmith.runtime.selfcheck import TOLERANCE, relative_error
from draftsmith.target import base_model, text_config

CHECK_TOKENS = 16  # tokens of the check prompt


@dataclass(frozen=True)
class OutputHead:
    """transform(x @ weightᵀ + bias): the target's logits from its final hidden states x."""

    weight: torch.Tensor  # [V, H]
    bias: torch.Tensor | None = None  # [V]
    scale: float = 1.0  # the logits are multiplied by it, then
    softcap: float | None = None  # soft-capped: cap·tanh(z/cap)

    def rows(self, ids: torch.Tensor) -> OutputHead:
        """The head on the vocab rows `ids` [Vd] only (the draft vocab)."""
        return replace(self, weight=self.weight[ids].contiguous(), bias=None if self.bias is None else self.bias[ids])

    def to(self, device: torch.device) -> OutputHead:
        return replace(self, weight=self.weight.to(device), bias=None if self.bias is None else self.bias.to(device))

    def linear(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., H] -> x @ Wᵀ + b [..., V] in the weight's dtype: the logits before the
        (monotonic) transform, so their argmax is the model's."""
        z = x.to(self.weight.dtype) @ self.weight.T
        return z if self.bias is None else z + self.bias

    def transform(self, z: torch.Tensor) -> torch.Tensor:
        """The model's elementwise transform of the lm_head's output z [..., V]."""
        if self.scale != 1.0:
            z = z * self.scale
        if self.softcap is not None:
            z = softcap(z, self.softcap)
        return z

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., H] -> the model's logits [..., V]."""
        return self.transform(self.linear(x))

    def describe(self) -> str:
        parts = ["final @ lm_headᵀ" + (" + bias" if self.bias is not None else "")]
        if self.scale != 1.0:
            parts.append(f"× {self.scale:g}")
        if self.softcap is not None:
            parts.append(f"soft-capped at {self.softcap:g}")
        return ", ".join(parts)


def output_head(model: nn.Module) -> OutputHead:
    """The model's output path, from its output embedding and the config fields that its
    causal-LM forward applies to the logits (the model's own config: a VLM wrapper's forward
    reads its own, not its text config's)."""
    out = model.get_output_embeddings()
    if out is None or getattr(out, "weight", None) is None:
        raise UserError(
            f"{type(model).__name__} has no output embedding (lm_head): draftsmith trains drafters for causal LMs"
        )
    cfg = model.config
    scale = 1.0 / float(getattr(cfg, "logits_scaling", None) or 1.0) * float(getattr(cfg, "logit_scale", None) or 1.0)
    cap = getattr(cfg, "final_logit_softcapping", None)
    bias = getattr(out, "bias", None)
    return OutputHead(out.weight.detach(), None if bias is None else bias.detach(), scale, float(cap) if cap else None)


@torch.no_grad()
def check_output_head(model: nn.Module, head: OutputHead) -> None:
    """One forward of a short random prompt: `head` on the final hidden state must give
    `model(ids).logits` within the dtype's tolerance; a UserError naming the model class if not."""
    dtype = head.weight.dtype
    tol = TOLERANCE.get(dtype, TOLERANCE[torch.float16])
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, int(text_config(model.config).vocab_size), (1, CHECK_TOKENS), generator=gen)
    seen: dict[str, torch.Tensor] = {}

    def keep_final(_module: nn.Module, _args: tuple, out: tuple) -> None:  # the base model's output: final first
        seen["final"] = out[0]  # [1, T, H]

    hook = base_model(model).register_forward_hook(keep_final)
    try:
        ref = model(input_ids=ids.to(model.get_input_embeddings().weight.device), use_cache=False).logits[0]  # [T, V]
    finally:
        hook.remove()
    ours = head.logits(seen["final"][0].to(head.weight.device))  # [T, V]
    err = relative_error(ours, ref.to(ours.device)) if ours.shape == ref.shape else float("inf")
    if not err <= tol:  # NaN fails too
        raise UserError(
            f"{type(model).__name__}: its logits are not {head.describe()} of its final hidden state "
            f"(they differ by {err:.2g} of the largest logit; tolerance {tol:g} in {str(dtype).removeprefix('torch.')}). "
            "Its forward does something to the logits that draftsmith does not know, so training would "
            "learn from a wrong teacher: this model is not supported for training"
        )
