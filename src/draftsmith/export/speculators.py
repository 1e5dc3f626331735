"""The speculators layout (`--format speculators`), which vLLM reads through its speculators config.

    config.json        speculators_model_type "eagle3", architectures ["Eagle3Speculator"],
                       transformer_layer_config (a Llama config), draft_vocab_size, target_hidden_size,
                       norm_before_residual, norm_before_fc, fc_norm, norm_output (always written: vLLM's
                       `update_eagle3` copies them into the draft config, assuming norm_before_residual
                       true when it is missing), eagle_aux_hidden_state_layer_ids (vLLM's convention),
                       speculators_config {algorithm, proposal_methods [greedy, speculative_tokens],
                       default_proposal_method, verifier {name_or_path, architectures}},
                       draftsmith: {...} (conventions, for the reload); P-EAGLE: speculators_model_type
                       "peagle" (vLLM: method eagle3 with parallel_drafting), mask_token_id, and the
                       architecture options in transformer_layer_config too (`update_peagle` copies
                       only norm_before_residual and norm_before_fc from the top level)
    model.safetensors  layers.0.* (draftsmith's midlayer.*), layers.{i}.* (extra_layers.{i-1}.*), fc, norm,
                       lm_head, d2t, t2d (+ embed_tokens, input_norm with norm_before_fc, fc_norm.{i} with
                       fc_norm: speculators' own names; mask_hidden for P-EAGLE); the layer count is
                       transformer_layer_config.num_hidden_layers, as speculators and vLLM read it

vLLM is the only engine that reads this layout: SGLang's LlamaForCausalLMEagle3 looks weights up
as `midlayer.*` and silently skips `layers.0.*`, so an SGLang export of this layout is refused.
No file I/O in this module.
"""

from __future__ import annotations

from typing import Any

import torch

from draftsmith.draft.layouts import LAYER_PREFIX, RECORD_KEY, TOP_LEVEL_IDS, arch_options, to_engine_key
from draftsmith.draft.model import DrafterConfig
from draftsmith.draft.peagle import speculators_fields
from draftsmith.errors import UserError
from draftsmith.export.eagle import llama_fields, record
from draftsmith.layers import to_engine

# speculators' class of each method this layout holds; its speculators_model_type is the method's name
ARCHITECTURES = {"eagle3": "Eagle3Speculator", "peagle": "PEagleSpeculator"}


def check_engine_for_speculators(engine: str) -> None:
    if engine != "vllm":
        raise UserError(
            f"--format speculators --engine {engine}: only vLLM reads the speculators layout. SGLang's "
            "LlamaForCausalLMEagle3 loads weights named midlayer.* and silently skips layers.0.*, so the "
            "drafter would serve with random weights. Use --format eagle --engine sglang"
        )


def verifier_architectures(model_type: str) -> list[str]:
    """The target's HF architecture from its model_type (transformers' causal-LM mapping)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    arch = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type)
    if arch is None:
        raise UserError(
            f"cannot tell the verifier's architecture from model_type {model_type!r}; "
            "pass --verifier-architectures (e.g. LlamaForCausalLM)"
        )
    return [arch]


def speculators_config(
    cfg: DrafterConfig,
    dtype: str,
    target: dict[str, Any],
    verifier: str,
    architectures: list[str],
    speculative_tokens: int,
) -> dict[str, Any]:
    model_type = cfg.method
    layer_fields, top_fields = speculators_fields(cfg)
    config: dict[str, Any] = {
        "architectures": [ARCHITECTURES[model_type]],
        "speculators_model_type": model_type,
        "transformer_layer_config": {**llama_fields(cfg, dtype), **layer_fields},
        "draft_vocab_size": cfg.draft_vocab_size,
        **arch_options(cfg),
        TOP_LEVEL_IDS: to_engine(cfg.aux_layer_ids, "vllm"),
        "speculators_config": {
            "algorithm": model_type,
            "proposal_methods": [
                {"proposal_type": "greedy", "speculative_tokens": speculative_tokens, "verifier_accept_k": 1}
            ],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": verifier, "architectures": architectures},
        },
        "torch_dtype": dtype,
    }
    if cfg.target_hidden_size != cfg.hidden_size:
        config["target_hidden_size"] = cfg.target_hidden_size
    config.update(top_fields)
    config[RECORD_KEY] = record(cfg, "vllm", {TOP_LEVEL_IDS: "vllm"}, target)
    return config


def to_speculators_keys(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """midlayer.* -> layers.0.*, extra_layers.{j}.* -> layers.{j+1}.*; every other key keeps its name."""
    return {to_engine_key(k, LAYER_PREFIX): v for k, v in tensors.items()}
