"""The generic target engine: the model's own Hugging Face forward with a transformers
`DynamicCache`, for targets that draftsmith's static-KV engine (engine.py) does not cover
(`selfcheck.open_engine` decides). Slower (no CUDA graphs, a growing cache), but exact for any
`AutoModelForCausalLM` whose cache can be cropped: the model computes its own logits, with
whatever multipliers, soft-capping or sliding windows it has.

Chain verification only: a rejected draft suffix is dropped by cropping the cache back to the
accepted length before the next forward (`chain`), so every forward extends a causal
sequence. Tree verification would need a 4-D attention mask over the draft tree, which HF
models do not all accept; `open_engine` refuses `--mode tree` on this path.

The drafter's aux hidden states come from the same forward, by forward pre-hooks in
draftsmith's layer convention (runtime/capture.py: id k = residual entering decoder layer k,
k == L the final norm's input).
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING

import torch
from torch import nn

from draftsmith.errors import UserError
from draftsmith.runtime.capture import hooked
from draftsmith.target import text_config

if TYPE_CHECKING:
    from transformers import DynamicCache


def cache_kwarg(model: nn.Module) -> str:
    """The name under which the model's forward takes a KV cache: `cache` in recent transformers,
    `past_key_values` before. A name the forward does not know would be swallowed by its
    **kwargs and the cache silently ignored, so look it up rather than guess."""
    params = inspect.signature(model.forward).parameters
    for name in ("cache", "past_key_values"):
        if name in params:
            return name
    raise UserError(f"{type(model).__name__}.forward takes no KV cache (neither `cache` nor `past_key_values`), "
                    "which draftsmith's generic engine needs")


def new_cache(model: nn.Module) -> DynamicCache:
    """An empty DynamicCache laid out from the model's config (sliding-window layers included)
    that keeps what `crop` needs to undo the tokens of a rejected draft."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    cache.activate_past_recording()  # sliding-window layers keep the states a crop restores
    return cache


class HFEngine:
    """Batch 1, chain only. `prefill` starts a new cache; `chain(ids, start)` first crops the
    cache to `start` tokens (dropping a rejected draft), then runs `ids` at positions
    start..start+T-1. Same return values as `TargetEngine`: logits [T, V] (float32) and aux
    [T, n_aux*H]."""

    name = "generic"

    def __init__(self, model: nn.Module, aux_layer_ids: list[int], max_len: int, reason: str = "") -> None:
        self.model, self.aux_layer_ids, self.max_len, self.reason = model, list(aux_layer_ids), max_len, reason
        p = next(model.parameters())
        self.device, self.dtype = p.device, p.dtype
        self.vocab_size = int(text_config(model.config).vocab_size)
        self.cache_arg = cache_kwarg(model)
        self.cache = new_cache(model)
        if not self.cache.is_croppable:
            raise UserError(f"{type(model).__name__}: no path of draftsmith can verify drafts for this model: its cache "
                            "cannot be cropped (recurrent or linear-attention layers keep a state, not per-token keys), "
                            "so a rejected draft cannot be undone")
        self.capture_seconds = 0.0  # nothing is captured: no CUDA graphs on this path

    def graph(self, t: int, width: int | None = None) -> None:
        """No CUDA graphs on the generic path (the cache grows); kept for the engine interface."""

    @torch.no_grad()
    def _run(self, ids: torch.Tensor, start: int) -> tuple[torch.Tensor, torch.Tensor]:
        """ids [T] at positions start..start+T-1, after the cache's first `start` tokens."""
        t = ids.shape[0]
        pos = torch.arange(start, start + t, device=self.device)[None]  # [1, T]
        with hooked(self.model, self.aux_layer_ids) as captured:
            out = self.model(input_ids=ids[None], position_ids=pos, use_cache=True, **{self.cache_arg: self.cache})
        if self.cache.get_seq_length() != start + t:  # the forward ignored or replaced our cache
            raise UserError(f"{type(self.model).__name__} did not extend the KV cache it was given "
                            f"({self.cache.get_seq_length()} tokens, expected {start + t}); the generic engine cannot run it")
        aux = (torch.cat([captured[k][0] for k in self.aux_layer_ids], dim=-1) if self.aux_layer_ids
               else torch.empty(t, 0, device=self.device, dtype=self.dtype))
        return out.logits[0].float(), aux  # [T, V], [T, n_aux*H]

    def prefill(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A new cache holding the prompt `ids [P]` at positions 0..P-1."""
        p = ids.shape[0]
        if p >= self.max_len:
            raise UserError(f"prompt of {p} tokens does not fit the KV cache of {self.max_len}; raise --max-len")
        self.cache = new_cache(self.model)
        return self._run(ids, 0)

    def chain(self, ids: torch.Tensor, start: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Crop the cache to its first `start` tokens, then run `ids [T]` at start..start+T-1."""
        held = self.cache.get_seq_length()
        if start > held:
            raise ValueError(f"chain at {start} after only {held} cached tokens")
        self.cache.crop(start - held)  # a count to remove (<= 0); 0 still trims sliding layers to their window
        return self._run(ids, start)
