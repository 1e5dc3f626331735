"""The EAGLE-3 layout (`--format eagle`) that vLLM and SGLang load, and the checks every export passes.

    config.json        a Llama config: architectures ["LlamaForCausalLMEagle3"], num_hidden_layers,
                       draft_vocab_size, target_hidden_size (when it differs),
                       norm_before_residual, norm_before_fc, fc_norm, norm_output  always written
                       eagle_config.eagle_aux_hidden_state_layer_ids   in the chosen engine's convention
                       eagle_config.norm_before_fc                     vLLM reads it here first
                       eagle_aux_hidden_state_layer_ids (top level)    always in vLLM's convention
                       draftsmith: {...}                               which convention each field uses
                       pard_token, ptd_token_id                        P-EAGLE: the placeholder token
    model.safetensors  midlayer.*, fc.weight, norm.weight, lm_head.weight, d2t, t2d (+ embed_tokens.weight,
                       input_norm.weight with norm_before_fc, fc_norm.{i}.weight with fc_norm,
                       layers.{i}.* for the layers after the first: vLLM's names for them, and for
                       SGLang also layers.{i}.hidden_norm.weight (export/sglang.py); P-EAGLE:
                       mask_hidden [n_aux*H_t], which vLLM loads with parallel_drafting=True)

Who reads what (see docs/engine-fields.md for the sources):
- vLLM reads the top-level ids first, then eagle_config's (`_get_eagle3_aux_layers_from_config`);
  its ids are layer inputs, the same as draftsmith's.
- SGLang and SpecForge read only eagle_config's ids (`ModelRunner.__init__`), as layer outputs
  (`set_eagle3_layers_to_capture` adds 1), so SGLang's ids are one lower.
Writing the top level in vLLM's convention makes an `--engine sglang` export load correctly in
vLLM too. vLLM's llama_eagle3 reads the architecture options (norm_before_fc from eagle_config,
then the top level; the others from the top level), names the weights `input_norm` and
`fc_norm.{i}` as draftsmith does, and builds `num_hidden_layers` layers (its `layers.0` is the
EAGLE-3 layer, loaded from `midlayer.*`; the rest plain Llama layers). SGLang's does the same
from a release on that depends on the option, and never reads norm_before_residual
(export/sglang.py says which release serves what; a drafter the chosen release would serve
wrongly is refused). The draftsmith key names of the first layer are the EAGLE reference names;
the later layers get vLLM's `layers.{i}`. No file I/O in this module.
"""

from __future__ import annotations

from typing import Any

import torch

from draftsmith.draft.layouts import (
    DRAFTSMITH_PREFIX,
    NESTED_IDS,
    RECORD_KEY,
    TOP_LEVEL_IDS,
    arch_options,
    to_engine_key,
)
from draftsmith.draft.model import DrafterConfig, Eagle3Drafter
from draftsmith.draft.peagle import engine_fields
from draftsmith.errors import UserError
from draftsmith.export import sglang
from draftsmith.layers import to_engine, validate_layers

ARCHITECTURE = "LlamaForCausalLMEagle3"
ENGINES = ("vllm", "sglang")


def check_engine(engine: str) -> str:
    if engine not in ENGINES:
        raise UserError(
            f"--engine {engine!r}: draftsmith exports for {', '.join(ENGINES)} only, whose layer-id "
            "conventions are known and tested; pick one of them"
        )
    return engine


def check_exportable(
    cfg: DrafterConfig, engine: str, num_target_layers: int | None, sglang_release: str | None = None
) -> None:
    """Refuse drafters that an engine (SGLang: of `sglang_release`, default the newest read) would
    load without error but serve wrongly."""
    try:
        validate_layers(list(cfg.aux_layer_ids), num_target_layers)  # the three ids the engines capture
    except UserError as e:
        raise UserError(f"this drafter's auxiliary layers cannot be served: {e}; retrain it with such ids") from None
    if cfg.norm_before_fc and cfg.fc_norm:
        raise UserError(
            "this drafter uses both norm_before_fc and fc_norm: draftsmith applies the per-layer fc_norm "
            "before input_norm, vLLM's llama_eagle3 applies input_norm first, and speculators refuses the "
            "pair, so no engine would serve it as trained. Retrain with one of the two"
        )
    why = sglang.refusal(cfg, sglang_release) if engine == "sglang" else None  # (export.run checks the method's)
    if why is not None:
        raise UserError(why)


def llama_fields(cfg: DrafterConfig, dtype: str) -> dict[str, Any]:
    """The Llama decoder-layer fields both layouts carry (a config `AutoConfig` can read)."""
    return {
        "model_type": "llama",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": cfg.hidden_act,
        "rms_norm_eps": cfg.rms_norm_eps,
        "max_position_embeddings": cfg.max_position_embeddings,
        "rope_theta": cfg.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,  # SGLang would use embed_tokens as lm_head if true
        "torch_dtype": dtype,
    }


def record(cfg: DrafterConfig, engine: str, conventions: dict[str, str], target: dict[str, Any]) -> dict[str, Any]:
    """What draftsmith needs to reload the export exactly: conventions and draftsmith's own ids."""
    return {
        "format_version": 1,
        "engine": engine,
        "layer_id_conventions": conventions,
        "aux_layer_ids": list(cfg.aux_layer_ids),
        "method": cfg.method,
        "target": target,
    }


def eagle_config(cfg: DrafterConfig, engine: str, dtype: str, target: dict[str, Any]) -> dict[str, Any]:
    config: dict[str, Any] = {"architectures": [ARCHITECTURE], **llama_fields(cfg, dtype)}
    config["draft_vocab_size"] = cfg.draft_vocab_size
    if cfg.target_hidden_size != cfg.hidden_size:
        config["target_hidden_size"] = cfg.target_hidden_size
    config.update(arch_options(cfg))
    config.update(engine_fields(cfg))  # P-EAGLE: its placeholder token, as vLLM's proposer reads it
    config[TOP_LEVEL_IDS] = to_engine(cfg.aux_layer_ids, "vllm")
    config["eagle_config"] = {
        "use_aux_hidden_state": True,
        TOP_LEVEL_IDS: to_engine(cfg.aux_layer_ids, engine),
        "norm_before_fc": cfg.norm_before_fc,
    }
    config[RECORD_KEY] = record(cfg, engine, {TOP_LEVEL_IDS: "vllm", NESTED_IDS: engine}, target)
    return config


def export_tensors(model: Eagle3Drafter, include_embeddings: bool, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """draftsmith's state dict in the EAGLE key names (the same, but layers.{i} for extra_layers.{i-1}),
    floats cast to `dtype`."""
    out = {}
    for key, value in model.state_dict().items():
        if key == "embed_tokens.weight" and not include_embeddings:
            continue
        value = value.detach().cpu()
        out[to_engine_key(key, DRAFTSMITH_PREFIX)] = (
            value.to(dtype) if value.is_floating_point() else value
        ).contiguous()
    return out
