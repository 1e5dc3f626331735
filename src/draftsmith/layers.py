"""The one layer-id convention, and the conversions at the edges.

Inside draftsmith, layer id `k` is the residual stream **entering** decoder layer `k`: HF's
`output_hidden_states[k]`, and what vLLM reads from `eagle_aux_hidden_state_layer_ids`.
`k == num_layers` is the output of the last decoder layer (before the final norm).

Engines that number layers differently are converted here and only here.
"""

from __future__ import annotations

from typing import Literal

from draftsmith.errors import UserError

Engine = Literal["draftsmith", "vllm", "sglang", "eagle", "modelopt"]

# Offset added to a draftsmith id to get the id an engine's config expects.
#   vllm:   reads the layer-input convention (hidden state entering layer k)       -> same ids
#   sglang: config ids mean "output of layer i" and SGLang adds 1 internally        -> one lower
#   eagle:  the EAGLE reference code's eagle_aux_hidden_state_layer_ids, as vLLM     -> same ids
#   modelopt: forward hooks on the outputs of layers i (NVIDIA Model-Optimizer,
#           modelopt/torch/speculative/plugins/hf_eagle.py, HFEagleModel.modify)    -> one lower
_OFFSETS: dict[str, int] = {"draftsmith": 0, "vllm": 0, "eagle": 0, "sglang": -1, "modelopt": -1}


N_AUX = 3  # EAGLE-3 concatenates three target layers: vLLM's and SGLang's llama_eagle3 size fc as 3 x hidden


def default_aux_layers(num_layers: int) -> list[int]:
    """EAGLE-3's default auxiliary layers `[2, L//2, L-3]` in draftsmith's convention."""
    if num_layers < 7:  # tiny test models, where [2, L//2, L-3] would repeat ids
        if num_layers > N_AUX:
            return sorted({1, num_layers // 2, num_layers - 1})
        return sorted({0, num_layers // 2, num_layers})  # a toy too small for three capturable ids
    return [2, num_layers // 2, num_layers - 3]


def check_layer_ids(layers: list[int], count: int | None = N_AUX) -> list[int]:
    """What can be checked before the target is loaded: `count` distinct, non-negative ids (EAGLE-3's
    N_AUX; None: any number of them, as many as a DFlash drafter is given, `Method.aux_count`).
    Returns them sorted. (Config fields named `aux_layer_ids` run this, with any count, when they
    are parsed; the command checks the count once it knows the drafter's method.)"""
    layers = sorted(int(k) for k in layers)
    if not layers:
        raise UserError("no layer ids given; give distinct ids, or leave them out for the default [2, L//2, L-3]")
    if count is not None and len(layers) != count:
        raise UserError(
            f"layer ids {layers}: EAGLE-3 takes exactly {N_AUX} auxiliary layers (vLLM's and SGLang's fc is "
            f"{N_AUX} x the target's hidden size); give {N_AUX} ids, or leave them out for the default [2, L//2, L-3]"
        )
    if len(set(layers)) != len(layers):
        raise UserError(f"layer ids {layers} contain duplicates; give distinct ids")
    if layers[0] < 0:
        raise UserError(f"layer ids {layers}: ids count from 0 (id k = the hidden state entering decoder layer k)")
    return layers


def validate_layers(layers: list[int], num_layers: int | None, count: int | None = N_AUX) -> list[int]:
    """The one check of auxiliary layer ids, for extract, train and export: `check_layer_ids`,
    and every id one that the engines capture, 1..L-1 (the residual stream entering decoder
    layers 1..L-1: id 0, the embeddings, and id L, the last layer's output, are never captured).
    A toy target with no three such ids (L <= 3) may use 0..L; with `num_layers` unknown (a
    drafter without its target's record) only id 0 is refused. Returns the ids sorted."""
    layers = check_layer_ids(layers, count)
    toy = num_layers is not None and num_layers <= N_AUX
    lo, hi = (0, num_layers) if toy else (1, None if num_layers is None else num_layers - 1)
    bad = [k for k in layers if k < lo or (hi is not None and k > hi)]
    if bad:
        span = f"{lo}..{hi}" if hi is not None else f"{lo}..L-1"
        last = "L" if num_layers is None else str(num_layers)  # L: the count, where it is not recorded
        why = (
            f"a toy target of {num_layers} layers may use 0..{num_layers}"
            if toy
            else f"the engines capture the hidden state entering decoder layers {span}, so id 0 (the embeddings) and "
            f"id {last} (the last layer's output) are never captured"
        )
        default = f" (the default {default_aux_layers(num_layers)} is)" if num_layers is not None else ""
        has = (
            f"this target has {num_layers} decoder layers"
            if num_layers is not None
            else "the target's layer count L is not recorded"
        )
        raise UserError(
            f"layer ids {bad} are out of range: {has}, so ids must be in "
            f"{span} (draftsmith convention: id k = the hidden state entering layer k); {why}. Choose ids in {span}{default}"
        )
    return layers


def resolve_aux_layers(layers: list[int] | None, num_layers: int, count: int | None = N_AUX) -> list[int]:
    """The aux layer ids a command runs with on a target of `num_layers` decoder layers: the ids
    given (`--aux-layer-ids`), else `default_aux_layers`; checked by `validate_layers` (`count` of
    them), sorted."""
    return validate_layers(layers or default_aux_layers(num_layers), num_layers, count)


def to_engine(layers: list[int], engine: str) -> list[int]:
    """draftsmith ids -> the ids `engine` expects in its config."""
    if engine not in _OFFSETS:
        raise UserError(f"unknown engine {engine!r}: known layer-id conventions are {sorted(_OFFSETS)}")
    return [k + _OFFSETS[engine] for k in layers]


def from_engine(layers: list[int], engine: str) -> list[int]:
    """Ids as written in `engine`'s config -> draftsmith ids."""
    if engine not in _OFFSETS:
        raise UserError(f"unknown engine {engine!r}: known layer-id conventions are {sorted(_OFFSETS)}")
    return [k - _OFFSETS[engine] for k in layers]


def engine_capture_ids(aux_layer_ids: list[int], num_layers: int, engine: str) -> list[int]:
    """The layer ids to ask `engine`'s hidden-state capture for when it fills a store, in its
    own convention: the aux layers and id L (the last layer's output, before the final norm,
    from which the store's final state is made), ascending and once each. vLLM's
    `extract_hidden_states` returns its slots in ascending layer order whatever order its
    config lists them in, so slot j holds the j-th id of this list."""
    return sorted(set(to_engine(list(aux_layer_ids) + [num_layers], engine)))
