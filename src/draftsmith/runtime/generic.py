"""The generic target engine: the model's own Hugging Face forward with a transformers
`DynamicCache`, for targets that the static-KV engine (engine.py) does not cover
(`engine_choice.open_engine` decides). Slower (no CUDA graphs, a growing cache), but exact for any
`AutoModelForCausalLM` whose cache can be cropped: the model computes its own logits, with
whatever multipliers, soft-capping or sliding windows it has.

A rejected draft suffix is dropped by cropping the cache to the accepted length (`chain`). A
draft tree runs in one forward under a 4-D attention mask (each node sees the cached tokens and
its ancestors, `tree`), and the accepted path's keys and values are moved behind the context
(`compact`) before the next crop. `selfcheck.generic_tree_problem` checks that a model honours
the mask and keeps every cached position; where it does not, `open_engine` refuses `--mode tree`
on this path with the reason. The aux hidden states come from the same forward, by forward
pre-hooks in draftsmith's layer convention (runtime/capture.py).
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
    raise UserError(
        f"{type(model).__name__}.forward takes no KV cache (neither `cache` nor `past_key_values`), "
        "which draftsmith's generic engine needs"
    )


def new_cache(model: nn.Module) -> DynamicCache:
    """An empty DynamicCache laid out from the model's config (sliding-window layers included)
    that keeps what `crop` needs to undo the tokens of a rejected draft."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    cache.activate_past_recording()  # sliding-window layers keep the states a crop restores
    return cache


class HFEngine:
    """Batch 1. `prefill` starts a new cache; `chain(ids, start)` first crops the cache to
    `start` tokens (dropping a rejected draft), then runs `ids` at positions start..start+T-1;
    `tree` does the same for a draft tree. Same return values as `TargetEngine`: logits [T, V]
    (float32) and aux [T, n_aux*H]."""

    name = "generic"
    compiled = False  # no graphs, nothing compiled (TargetEngine's flag)
    fused = False  # the model's own projections (TargetEngine's flag)

    def __init__(self, model: nn.Module, aux_layer_ids: list[int], max_len: int, reason: str = "") -> None:
        self.model, self.aux_layer_ids, self.max_len, self.reason = model, list(aux_layer_ids), max_len, reason
        p = next(model.parameters())
        self.device, self.dtype = p.device, p.dtype
        self.vocab_size = int(text_config(model.config).vocab_size)
        self.cache_arg = cache_kwarg(model)
        self.cache = new_cache(model)
        if not self.cache.is_croppable:
            raise UserError(
                f"{type(model).__name__}: no path of draftsmith can verify drafts for this model: its cache "
                "cannot be cropped (recurrent or linear-attention layers keep a state, not per-token keys), "
                "so a rejected draft cannot be undone"
            )
        self.capture_seconds = 0.0  # nothing is captured: no CUDA graphs on this path

    def graph(self, t: int, width: int | None = None) -> None:
        """No CUDA graphs on the generic path (the cache grows); kept for the engine interface."""

    @torch.no_grad()
    def _run(
        self, ids: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """ids [T] at positions pos [T], after the cache's tokens; `mask` [1, 1, T, cached+T]
        additive (0 or the dtype's min), default causal."""
        t, held = ids.shape[0], self.cache.get_seq_length()
        extra = {} if mask is None else {"attention_mask": mask}
        with hooked(self.model, self.aux_layer_ids) as captured:
            out = self.model(
                input_ids=ids[None], position_ids=pos[None], use_cache=True, **{self.cache_arg: self.cache}, **extra
            )
        if self.cache.get_seq_length() != held + t:  # the forward ignored or replaced our cache
            raise UserError(
                f"{type(self.model).__name__} did not extend the KV cache it was given "
                f"({self.cache.get_seq_length()} tokens, expected {held + t}); the generic engine cannot run it"
            )
        aux = (
            torch.cat([captured[k][0] for k in self.aux_layer_ids], dim=-1)
            if self.aux_layer_ids
            else torch.empty(t, 0, device=self.device, dtype=self.dtype)
        )
        return out.logits[0].float(), aux  # [T, V], [T, n_aux*H]

    def prefill(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A new cache holding the prompt `ids [P]` at positions 0..P-1."""
        p = ids.shape[0]
        if p >= self.max_len:
            raise UserError(f"prompt of {p} tokens does not fit the KV cache of {self.max_len}; raise --max-len")
        self.cache = new_cache(self.model)
        return self._run(ids, torch.arange(p, device=self.device))

    def _crop(self, start: int) -> None:
        held = self.cache.get_seq_length()
        if start > held:
            raise ValueError(f"a forward at {start} after only {held} cached tokens")
        self.cache.crop(start - held)  # a count to remove (<= 0); 0 still trims sliding layers to their window

    def chain(self, ids: torch.Tensor, start: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Crop the cache to its first `start` tokens, then run `ids [T]` at start..start+T-1."""
        self._crop(start)
        return self._run(ids, start + torch.arange(ids.shape[0], device=self.device))

    def tree(
        self, ids: torch.Tensor, start: int, anc: torch.Tensor, offsets: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Crop the cache to `start` tokens, then run a draft tree `ids [T]` (the root first) at
        positions start + offsets [T], node r seeing the cached tokens and the nodes c with
        anc[r, c] [T, T] (its ancestors and itself)."""
        self._crop(start)
        seen = torch.cat([anc.new_ones(anc.shape[0], start), anc], dim=1)  # [T, start+T]
        mask = torch.zeros(seen.shape, dtype=self.dtype, device=self.device).masked_fill(
            ~seen, torch.finfo(self.dtype).min
        )
        return self._run(ids, start + offsets, mask[None, None])

    def compact(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Move the keys and values at cache positions src [1, L] to dst [1, L] (a tree's accepted
        path, to the positions right after the context; the next forward crops the rest)."""
        for layer in self.cache.layers:
            layer.keys[:, :, dst[0]] = layer.keys[:, :, src[0]]  # [1, nkv, L, hd]; the right side is read first
            layer.values[:, :, dst[0]] = layer.values[:, :, src[0]]
