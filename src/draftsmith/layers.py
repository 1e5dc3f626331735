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


def default_aux_layers(num_layers: int) -> list[int]:
    """EAGLE-3's default auxiliary layers `[2, L//2, L-3]` in draftsmith's convention."""
    if num_layers < 7:
        # tiny test models, where [2, L//2, L-3] would repeat ids: first, middle and last
        return sorted({0, num_layers // 2, num_layers})
    return [2, num_layers // 2, num_layers - 3]


def validate_layers(layers: list[int], num_layers: int) -> list[int]:
    """Check ids are within `[0, num_layers]`, distinct and sorted; return them as a list."""
    layers = [int(k) for k in layers]
    bad = [k for k in layers if not 0 <= k <= num_layers]
    if bad:
        raise UserError(
            f"layer ids {bad} are out of range: this target has {num_layers} decoder layers, so ids "
            f"must be in 0..{num_layers} (draftsmith convention: id k = hidden state entering layer k)"
        )
    if len(set(layers)) != len(layers):
        raise UserError(f"layer ids {layers} contain duplicates")
    return sorted(layers)


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
