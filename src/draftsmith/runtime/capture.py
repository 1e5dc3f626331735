"""Hidden-state capture with forward hooks, used by `extract`, online training, the generic
engine (generic.py) and the engine self-check. The fast engine (engine.py) runs the decoder
layers' parts itself, so it records the same ids inside its own forward; the self-check
(selfcheck.py) holds it against these hooks.

Layer id `k` (draftsmith convention, see `draftsmith.layers`) is the residual stream entering
decoder layer `k`, captured by a forward pre-hook on that layer; `k == L` is the input of the
final norm. The final hidden state is the final norm's output, which is what the language
model's base module returns. The LM head never runs, so no vocab-sized tensor is made, and
`output_hidden_states=True` is never used (it would keep all L+1 layers alive).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from draftsmith.target import base_model, decoder_layers, final_norm

# Capture sees a new [B, T] with nearly every batch (length-bucketed samples). cuDNN's attention
# builds an execution plan for each new shape, host time paid every training step (experiments/LOG.md
# 2026-11-30 16:24); the flash and memory-efficient kernels need no plan.
VARIABLE_SHAPE_SDPA = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


@contextlib.contextmanager
def hooked(model: nn.Module, aux_layer_ids: list[int]) -> Iterator[dict[int, torch.Tensor]]:
    """Register pre-hooks that store the hidden state entering each layer in `aux_layer_ids`.
    Yields the dict they fill (`{k: [B, T, H]}`); hooks are removed on exit."""
    layers = decoder_layers(model)
    captured: dict[int, torch.Tensor] = {}
    handles = []

    def make_hook(k: int):
        def hook(_module: nn.Module, args: tuple, kwargs: dict) -> None:
            captured[k] = args[0] if args else kwargs["hidden_states"]

        return hook

    for k in aux_layer_ids:
        module = layers[k] if k < len(layers) else final_norm(model)
        handles.append(module.register_forward_pre_hook(make_hook(k), with_kwargs=True))
    try:
        yield captured
    finally:
        for h in handles:
            h.remove()


def supports_flex(model: nn.Module) -> bool:
    """Whether transformers can run `model`'s attention with flex_attention (`capture`'s "flex")."""
    return bool(getattr(model, "_supports_flex_attn", False)) and model._can_set_attn_implementation()


@contextlib.contextmanager
def attention_implementation(model: nn.Module, name: str | None) -> Iterator[None]:
    """Run the block with transformers' attention implementation `name` ("sdpa",
    "flex_attention", ...; None: the model's own), and give the model its own back after it: the
    target may be shared with later stages (a pipeline's eval) that expect what it was loaded with."""
    own = model.config._attn_implementation
    if name is None or name == own:
        yield
        return
    model.set_attn_implementation(name)
    try:
        yield
    finally:
        model.set_attn_implementation(own)


@contextlib.contextmanager
def capturing(model: nn.Module, aux_layer_ids: list[int], attention: str | None) -> Iterator[dict[int, torch.Tensor]]:
    """What a capture forward runs under: the hooks (`hooked`, yielding the dict they fill), the
    attention implementation (`attention_implementation`) and sdpa's variable-shape backends."""
    with (
        hooked(model, aux_layer_ids) as filled,
        sdpa_kernel(VARIABLE_SHAPE_SDPA),
        attention_implementation(model, attention),
    ):
        yield filled


def stacked_aux(captured: dict[int, torch.Tensor], aux_layer_ids: list[int], device: torch.device) -> torch.Tensor:
    """The hooked layers' inputs ({k: [B, T, H]}) side by side in `aux_layer_ids` order, on `device`:
    [B, T, n_aux*H]."""
    return torch.cat([captured[k].to(device) for k in aux_layer_ids], dim=-1)


@torch.no_grad()
def capture(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    aux_layer_ids: list[int],
    position_ids: torch.Tensor | None = None,
    attention: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One forward of the target without KV cache.

    input_ids, attention_mask: [B, T] (right-padded; padding rows are garbage to be sliced off)
    position_ids [B, T] (optional, with no attention_mask): several samples laid end to end in a
    row, each restarting at 0; transformers then attends within each sample only (its packed-
    sequence masks), which `packs_sequences` checks for the model at hand
    attention: transformers' attention implementation for this forward (None: the model's own).
    "flex_attention" computes a packed row's attention block by block, skipping the blocks
    between samples; sdpa's packed mask is a dense [T, T] tensor and every score is computed
    returns aux [B, T, n_aux*H] (layers concatenated in `aux_layer_ids` order), final [B, T, H],
    both on input_ids' device
    """
    with capturing(model, aux_layer_ids, attention) as captured:
        out = base_model(model)(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
        )
    # on the inputs' device: a target split over GPUs (`load_target(shard="auto")`) hands each layer's
    # input to it on that layer's GPU
    final = out.last_hidden_state.to(input_ids.device)  # [B, T, H], after the final norm
    aux = stacked_aux(captured, aux_layer_ids, input_ids.device)  # [B, T, n_aux*H]
    assert aux.shape[:2] == input_ids.shape and final.shape[:2] == input_ids.shape, (aux.shape, input_ids.shape)
    return aux, final


class CompiledCapture:
    """`capture` of one packed row (ids and positions [1, W], no mask) with the target's decoder
    layers compiled (torch.compile, static shapes: one width). The eager forward of a small target
    spends most of a row issuing its kernels: on the H200, 51.9 ms of host time a flex row against
    17.2 ms of kernels (bench/capture_bench.py). Compiled, it issues a few fused kernels a layer:
    the whole forward compiled was 3.02x faster, a whole training step 1.20x (H100, A-B-A: the
    recipe turns it on; train's default stays off).

    What is compiled is the layers' class's forward, once: every layer runs that one graph, its
    weights the graph's inputs (regional compilation), while the embedding, the rotary and mask
    set-up, the final norm and the hooks run eagerly around it. So the compile costs one layer's,
    not the model's: on the 2-core CPU for the embedded default's 30 layers, 14.1 s against 40.2 s
    for the whole forward (bench/capture_compile_cost.py), with which the recipe's first 100 steps took 135 s on an H100, about
    127 of them compiling this and the drafter's step (experiments/LOG.md 2026-12-06 13:19).
    Returns what `capture` returns, on the model's one device (a target split over GPUs is not
    compiled)."""

    def __init__(self, model: nn.Module, aux_layer_ids: list[int], attention: str | None) -> None:
        self.model, self.aux_layer_ids, self.attention = model, aux_layer_ids, attention
        self.layers = decoder_layers(model)
        # each layer class's forward (unbound: the layer is its first argument), compiled once for all its layers
        self.compiled = {cls: torch.compile(cls.forward, dynamic=False) for cls in {type(x) for x in self.layers}}

    @contextlib.contextmanager
    def _compiled_layers(self) -> Iterator[None]:
        """Each decoder layer forwards through its class's compiled forward while a row is captured
        (the hooks of `capturing` still run around it), and through its own after."""
        for layer in self.layers:
            layer.forward = functools.partial(self.compiled[type(layer)], layer)
        try:
            yield
        finally:
            for layer in self.layers:
                del layer.forward  # the instance attribute: the class's own forward again

    @torch.no_grad()
    def __call__(self, input_ids: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with capturing(self.model, self.aux_layer_ids, self.attention) as captured, self._compiled_layers():
            out = base_model(self.model)(input_ids=input_ids, position_ids=position_ids, use_cache=False)
            return stacked_aux(captured, self.aux_layer_ids, input_ids.device), out.last_hidden_state  # [1, W, ..]


def packed_positions(lengths: list[int], device: torch.device | str = "cpu") -> torch.Tensor:
    """Positions [sum(lengths)] of samples laid end to end, each restarting at 0."""
    return torch.cat([torch.arange(n) for n in lengths]).to(device)


def _probe(model: nn.Module) -> tuple[torch.Tensor, list[int], float]:
    """Two short deterministic samples laid end to end ([12] ids on the model's device), their
    lengths, and the relative tolerance of the model's dtype."""
    device = next(model.parameters()).device
    vocab = int(model.get_input_embeddings().weight.shape[0])
    lengths = [5, 7]
    ids = (torch.arange(sum(lengths), device=device) * 7919 + 11) % (vocab - 3) + 3  # [12]
    return ids, lengths, 1e-3 if next(model.parameters()).dtype == torch.float32 else 5e-2


def _agrees(
    model: nn.Module,
    aux_layer_ids: list[int],
    ids: torch.Tensor,
    lengths: list[int],
    tol: float,
    rows: list[tuple[torch.Tensor, torch.Tensor]],
) -> bool:
    """Whether each sample's rows ([1, n, ..] aux and final, in `lengths` order) equal capturing it alone."""
    start = 0
    for n, got in zip(lengths, rows, strict=True):
        alone = capture(model, ids[None, start : start + n], None, aux_layer_ids)
        for a, b in zip(alone, got, strict=True):
            if (b.float() - a.float()).abs().max() > tol * a.float().abs().max().clamp(min=1e-6):
                return False
        start += n
    return True


@torch.no_grad()
def packs_sequences(model: nn.Module, aux_layer_ids: list[int], attention: str | None = None) -> bool:
    """Whether `capture` of samples packed in one row (position_ids restarting per sample, no
    mask; with `attention`, see `capture`) gives each sample's own states, as capturing it alone
    does: two short samples, both ways, within the dtype's tolerance. A model whose forward
    ignores the packing (its own mask code, remote code) lets the second sample attend to the
    first and fails the check; one whose forward raises on the packed mask fails it too
    (transformers' DeepSeek-V3 with fewer key-value heads than heads: its MLA keys have every
    head, and sdpa's masked path repeats them again)."""
    ids, lengths, tol = _probe(model)
    try:
        aux, final = capture(
            model, ids[None], None, aux_layer_ids, packed_positions(lengths, ids.device)[None], attention
        )
    except torch.OutOfMemoryError:
        raise
    except RuntimeError:  # the forward cannot take this layout at all
        return False
    starts = [0, lengths[0]]
    rows = [(aux[:, s : s + n], final[:, s : s + n]) for s, n in zip(starts, lengths, strict=True)]
    return _agrees(model, aux_layer_ids, ids, lengths, tol, rows)


@torch.no_grad()
def pads_sequences(model: nn.Module, aux_layer_ids: list[int]) -> bool:
    """Whether `capture` of right-padded samples under an attention mask gives each sample's own
    states: the same two samples as `packs_sequences`, as a batch of two. A model whose masked
    forward raises (see `packs_sequences`) fails; it is captured one sample per forward instead."""
    ids, lengths, tol = _probe(model)
    batch = torch.zeros(2, max(lengths), dtype=ids.dtype, device=ids.device)  # [2, 7], right-padded
    mask = torch.zeros_like(batch)
    batch[0, : lengths[0]], batch[1] = ids[: lengths[0]], ids[lengths[0] :]
    mask[0, : lengths[0]], mask[1] = 1, 1
    try:
        aux, final = capture(model, batch, mask, aux_layer_ids)  # [2, 7, n*H], [2, 7, H]
    except torch.OutOfMemoryError:
        raise
    except RuntimeError:  # the forward cannot take a padding mask at all
        return False
    rows = [(aux[j : j + 1, :n], final[j : j + 1, :n]) for j, n in enumerate(lengths)]
    return _agrees(model, aux_layer_ids, ids, lengths, tol, rows)
