"""Independent readers of an exported drafter folder, written from vLLM's and SGLang's loaders.

They re-state what each engine does with a draft folder, so a test can check an export the way
the engine will load it. They must not reuse `draftsmith.export` (that is what they check).
Sources (read 2026-11-29; see docs/engine-fields.md):

vLLM
- vllm/transformers_utils/configs/speculators/base.py  SpeculatorsConfig.extract_transformers_pre_trained_config:
  a speculators config becomes `transformer_layer_config` updated by
- vllm/transformers_utils/configs/speculators/algos.py  update_eagle3: draft_vocab_size, target_hidden_size,
  norm_before_residual (default **True** when missing), norm_before_fc, fc_norm, norm_output (default
  False), top-level eagle_aux_hidden_state_layer_ids.
- vllm/v1/worker/gpu_model_runner.py  _get_eagle3_aux_layers_from_config: top-level
  `eagle_aux_hidden_state_layer_ids`, else `eagle_config["eagle_aux_hidden_state_layer_ids"]`, else the
  model default (2, L//2, L-3).
- vllm/model_executor/models/llama.py  LlamaModel.forward: `if idx in aux_hidden_state_layers:
  aux.append(hidden_states + residual)` *before* layer idx runs -> the input of layer idx (idx 0 has
  residual None, idx >= L is never reached).
- vllm/model_executor/models/llama_eagle3.py  LlamaDecoderLayer.__init__: getattr(config,
  "norm_before_residual", False); LlamaModel.__init__: fc input = target_hidden_size (or hidden_size) *
  num_aux (config num_aux_hidden_states, else len(eagle_config ids), else 3); norm_before_fc =
  eagle_config["norm_before_fc"], else the top-level field, else False -> input_norm over the fc input;
  getattr(config, "fc_norm", False) -> fc_norm[i] per aux chunk; getattr(config, "norm_output", False) ->
  the next step reads the post-norm output; combine_hidden_states applies input_norm, then fc_norm,
  then fc. Eagle3LlamaForCausalLM.load_weights: t2d skipped, d2t -> draft_id_to_target_id, "model."
  prefixed unless lm_head, "input_norm." skipped unless norm_before_fc; LlamaModel.load_weights:
  midlayer. -> layers.0., q/k/v -> qkv_proj, gate/up -> gate_up_proj, an unknown name is an error.
  LlamaModel.__init__ builds config.num_hidden_layers layers (vLLM PR #26164): layer 0's qkv_proj
  takes 2*hidden_size inputs (embedding and hidden state), the later layers' hidden_size (plain
  Llama layers on the hidden stream); a weight's shape must match its parameter's. In the
  speculators layout the count is transformer_layer_config.num_hidden_layers (read 2026-12-02).
  (Read 2026-11-30 in CarrotFlower0526/vllm at 4b0afbb, a fork tracking vLLM main that has PR #42143's
  eagle_config read of norm_before_fc; the index's own vllm-project/vllm snapshot predates the options.)

SGLang (python/sglang/srt/... in sgl-project/sglang at 03d5a77, re-read 2026-12-05 in the PyPI
wheels of sglang 0.5.10 to 0.5.23, sglang/srt/...: `sglang_view` takes the release)
- model_executor/model_runner.py  ModelRunner.__init__: ids only from the draft's
  `eagle_config["eagle_aux_hidden_state_layer_ids"]` (None on any error).
- models/llama.py  LlamaForCausalLM.set_eagle3_layers_to_capture: None -> [2, L//2, L-3],
  else [v + 1 for v in ids]; LlamaModel.forward captures `hidden_states + residual` before layer i.
- models/llama_eagle3.py, up to 0.5.11: LlamaDecoderLayer.forward: residual = un-normalised hidden
  (no norm_before_residual); LlamaModel: one layer, `midlayer`; fc straight on the aux states (no
  input_norm, no fc_norm), the next step reads the pre-norm output (no norm_output).
  LlamaForCausalLMEagle3.__init__: tie_word_embeddings -> lm_head is embed_tokens; load_weights: d2t
  -> hot_token_id = d2t + arange, t2d skipped, q/k/v and gate/up stacked, a name found neither as
  is nor under "model." is skipped silently. No reader for the speculators layout.
- from 0.5.12 (upstream #24663): LlamaModel builds `layers` of config.num_hidden_layers
  (load_weights renames midlayer -> layers.0 and aux_norm_low/mid/high -> fc_norm.0/1/2); layer 0
  reads cat(input_layernorm(embeds), hidden_norm(h)) on 2H inputs, a later layer's qkv_proj
  takes H and its input norm is `hidden_norm` (fused with the residual add; its
  `input_layernorm` is built and never used); fc input = (target_hidden_size or hidden_size) x
  num_aux (config num_aux_hidden_states, else len(eagle_config ids), else 3); config `fc_norm`
  (or `use_aux_norm`) -> fc_norm[i] per aux chunk; config `norm_output` -> the next step reads
  the post-norm output. Still no norm_before_residual (to 0.5.23).
- from 0.5.17: norm_before_fc = eagle_config["norm_before_fc"], else the top level, else False ->
  `input_norm` over the fc input, applied before fc_norm.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file

STACKED = (
    (".q_proj", ".qkv_proj"),
    (".k_proj", ".qkv_proj"),
    (".v_proj", ".qkv_proj"),
    (".gate_proj", ".gate_up_proj"),
    (".up_proj", ".gate_up_proj"),
)
LAYER_PARAMS = (
    "self_attn.qkv_proj.weight",
    "self_attn.o_proj.weight",
    "mlp.gate_up_proj.weight",
    "mlp.down_proj.weight",
    "input_layernorm.weight",
    "hidden_norm.weight",
    "post_attention_layernorm.weight",
)


@dataclass
class EngineView:
    captured_layers: list[int]  # i: the engine feeds the residual stream entering target layer i
    norm_before_residual: bool
    norm_before_fc: bool  # input_norm over the concatenated aux states before fc
    fc_norm: bool  # one norm per aux chunk before fc
    norm_output: bool  # the next draft step reads the post-norm output
    draft_vocab_size: int
    fc_in_features: int
    intermediate_size: int  # the MLP width the engine allocates (from the config)
    num_layers: int  # the decoder layers the engine builds (from the config)
    draft_to_target: torch.Tensor  # [draft_vocab] target id of each draft id
    loaded: dict[str, list[str]] = field(default_factory=dict)  # engine param -> checkpoint names
    skipped: list[str] = field(default_factory=list)  # checkpoint names the loader drops silently
    lm_head_is_embedding: bool = False
    input_norms: list[str] = field(default_factory=list)  # the norm each layer after the first applies to its input


def never_captured(view: EngineView, num_layers: int) -> list[int]:
    """Layers the loop `if i in layers: aux.append(hidden_states + residual)` before layer i never
    yields: 0 (residual is still None) and anything >= L (the loop has ended)."""
    return [i for i in view.captured_layers if not 1 <= i < num_layers]


def _mlp_width(weights: dict[str, torch.Tensor], config: dict) -> int:
    """The MLP width the engine allocates from `config`; like its weight loaders (which assert
    each parameter's shape), an error if the checkpoint's MLP weights have another."""
    width = int(config["intermediate_size"])
    for name, value in weights.items():
        rows = value.shape[1] if "down_proj" in name else value.shape[0]
        if ("gate_proj" in name or "up_proj" in name or "down_proj" in name) and rows != width:
            raise ValueError(f"{name} has shape {tuple(value.shape)}; the config's intermediate_size is {width}")
    return width


def _stacked(name: str) -> str:
    for shard, param in STACKED:
        if shard in name:
            return name.replace(shard, param)
    return name


def vllm_view(folder: Path, num_target_layers: int) -> EngineView:
    raw = json.loads((Path(folder) / "config.json").read_text())
    if "speculators_model_type" in raw:
        hf = dict(raw.get("transformer_layer_config", {}))
        hf["draft_vocab_size"] = raw.get("draft_vocab_size")
        if raw.get("target_hidden_size") is not None:
            hf["target_hidden_size"] = raw["target_hidden_size"]
        hf["norm_before_residual"] = raw.get("norm_before_residual", True)
        for option in ("norm_before_fc", "fc_norm", "norm_output"):
            hf[option] = raw.get(option, False)
        if raw.get("eagle_aux_hidden_state_layer_ids"):
            hf["eagle_aux_hidden_state_layer_ids"] = raw["eagle_aux_hidden_state_layer_ids"]
    else:
        hf = raw
    eagle_config = hf.get("eagle_config") or {}
    ids = hf.get("eagle_aux_hidden_state_layer_ids") or eagle_config.get("eagle_aux_hidden_state_layer_ids")
    if not ids:
        ids = [2, num_target_layers // 2, num_target_layers - 3]
    num_aux = hf.get("num_aux_hidden_states") or len(eagle_config.get("eagle_aux_hidden_state_layer_ids") or []) or 3
    norm_before_fc = bool(eagle_config.get("norm_before_fc", hf.get("norm_before_fc", False)))
    fc_norm = bool(hf.get("fc_norm", False))
    draft_vocab = hf.get("draft_vocab_size") or hf["vocab_size"]
    layers = int(hf.get("num_hidden_layers") or 1)
    params = {f"model.layers.{i}.{p}" for i in range(layers) for p in LAYER_PARAMS}
    params |= {
        "model.fc.weight",
        "model.norm.weight",
        "model.embed_tokens.weight",
        "lm_head.weight",
        "draft_id_to_target_id",
    }
    if norm_before_fc:
        params.add("model.input_norm.weight")
    if fc_norm:
        params |= {f"model.fc_norm.{i}.weight" for i in range(num_aux)}
    weights = load_file(str(Path(folder) / "model.safetensors"))
    loaded: dict[str, list[str]] = {}
    skipped = []
    for name in weights:
        if "t2d" in name:
            continue
        if "input_norm." in name and not norm_before_fc:
            skipped.append(name)
            continue
        if "d2t" in name:
            target = name.replace("d2t", "draft_id_to_target_id")
        else:
            target = name if "lm_head" in name else "model." + name
        target = _stacked(target.replace("midlayer.", "layers.0."))
        if target not in params:
            raise KeyError(f"vLLM has no parameter {target} (from {name})")
        if "qkv_proj" in target:  # layer 0 reads cat(embedding, hidden), the later layers the hidden state
            inputs = int(hf["hidden_size"]) * (2 if target.startswith("model.layers.0.") else 1)
            if weights[name].shape[1] != inputs:
                raise ValueError(
                    f"{name} has shape {tuple(weights[name].shape)}; vLLM's {target} takes {inputs} inputs"
                )
        loaded.setdefault(target, []).append(name)
    return EngineView(
        captured_layers=[int(i) for i in ids],
        norm_before_residual=bool(hf.get("norm_before_residual", False)),
        norm_before_fc=norm_before_fc,
        fc_norm=fc_norm,
        norm_output=bool(hf.get("norm_output", False)),
        draft_vocab_size=int(draft_vocab),
        fc_in_features=int(hf.get("target_hidden_size") or hf["hidden_size"]) * num_aux,
        intermediate_size=_mlp_width(weights, hf),
        num_layers=layers,
        draft_to_target=torch.arange(int(draft_vocab)) + weights["d2t"],
        loaded=loaded,
        skipped=skipped,
        input_norms=[f"model.layers.{i}.input_layernorm.weight" for i in range(1, layers)],
    )


SGLANG_NEWEST = (0, 5, 23)


def sglang_view(folder: Path, num_target_layers: int, release: tuple[int, int, int] = SGLANG_NEWEST) -> EngineView:
    raw = json.loads((Path(folder) / "config.json").read_text())
    assert "speculators_model_type" not in raw, "SGLang has no reader for the speculators layout"
    eagle_config = raw.get("eagle_config") or {}
    try:
        ids = raw["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    except (KeyError, TypeError):
        ids = None
    capture = [2, num_target_layers // 2, num_target_layers - 3] if ids is None else [int(v) + 1 for v in ids]
    layered = release >= (0, 5, 12)  # #24663: num_hidden_layers, fc_norm, norm_output
    layers = int(raw.get("num_hidden_layers") or 1) if layered else 1
    num_aux = (raw.get("num_aux_hidden_states") or len(ids or []) or 3) if layered else 3
    norm_before_fc = release >= (0, 5, 17) and bool(
        eagle_config.get("norm_before_fc", raw.get("norm_before_fc", False))
    )
    fc_norm = layered and bool(raw.get("fc_norm") or raw.get("use_aux_norm"))
    names = [f"model.layers.{i}" for i in range(layers)] if layered else ["model.midlayer"]
    params = {f"{layer}.{p}" for layer in names for p in LAYER_PARAMS} | {
        "model.fc.weight",
        "model.norm.weight",
        "model.embed_tokens.weight",
        "lm_head.weight",
    }
    if norm_before_fc:
        params.add("model.input_norm.weight")
    if fc_norm:
        params |= {f"model.fc_norm.{i}.weight" for i in range(num_aux)}
    legacy = {
        "midlayer": "layers.0",
        "aux_norm_low": "fc_norm.0",
        "aux_norm_mid": "fc_norm.1",
        "aux_norm_high": "fc_norm.2",
    }
    weights = load_file(str(Path(folder) / "model.safetensors"))
    loaded: dict[str, list[str]] = {}
    skipped, hot = [], None
    for name, value in weights.items():
        if "d2t" in name:
            hot = value + torch.arange(value.shape[0])
            continue
        if "t2d" in name:
            continue
        mapped = name
        for old, new in legacy.items() if layered else ():
            mapped = mapped.replace(old, new)
        mapped = _stacked(mapped)
        target = mapped if mapped in params else f"model.{mapped}"
        if target not in params:
            skipped.append(name)
            continue
        if "qkv_proj" in target:  # default_weight_loader asserts the shape: layer 0 on 2H inputs, the others on H
            inputs = int(raw["hidden_size"]) * (2 if target.startswith(names[0]) else 1)
            if value.shape[1] != inputs:
                raise ValueError(f"{name} has shape {tuple(value.shape)}; SGLang's {target} takes {inputs} inputs")
        loaded.setdefault(target, []).append(name)
    return EngineView(
        captured_layers=capture,
        norm_before_residual=False,
        norm_before_fc=norm_before_fc,
        fc_norm=fc_norm,
        norm_output=layered and bool(raw.get("norm_output", False)),
        draft_vocab_size=int(raw.get("draft_vocab_size") or raw["vocab_size"]),
        fc_in_features=int(raw.get("target_hidden_size") or raw["hidden_size"]) * num_aux,
        intermediate_size=_mlp_width(weights, raw),
        num_layers=layers,
        draft_to_target=hot,
        loaded=loaded,
        skipped=skipped,
        lm_head_is_embedding=bool(raw.get("tie_word_embeddings", False)),
        input_norms=[f"{layer}.hidden_norm.weight" for layer in names[1:]],
    )
