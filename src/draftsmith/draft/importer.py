"""Load an EAGLE-3 folder with a `config.json` as a draftsmith drafter.

The reader lives in the core (draft/) because `eval` and `export` both load such folders;
`export` writes them (export/eagle.py, export/speculators.py) with the names in layouts.py.
It reads the EAGLE reference / SpecForge / ModelOpt layout (`--format eagle`) and speculators'
(`--format speculators`), from model.safetensors, sharded safetensors or a `weights_only`
pytorch_model.bin; architecture options as vLLM reads them; layer ids back in draftsmith's
convention (`convention=` overrides the guess). A folder without embeddings comes back with
`meta.needs_target_embeddings` (`model.load_target_embeddings(...)`). Which field and weight
each layout names, and why: docs/export.md and docs/engine-fields.md.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from draftsmith.draft.layouts import (
    ARCH_OPTIONS,
    EXTRA_PREFIX,
    NESTED_IDS,
    RECORD_KEY,
    TOP_LEVEL_IDS,
    check_vocab,
    to_draftsmith_key,
)
from draftsmith.draft.model import DrafterConfig, Eagle3Drafter
from draftsmith.draft.peagle import SPECULATORS_TYPES, read_method
from draftsmith.errors import UserError
from draftsmith.fsutil import read_safetensors
from draftsmith.layers import from_engine

FIX = "re-export it, or copy the folder again from its source"
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
IGNORED_PREFIXES = ("verifier_",)  # speculators' frozen copies of the verifier's norm / lm_head


def read_weights(folder: Path) -> dict[str, torch.Tensor]:
    """All tensors of a checkpoint folder, whatever the file layout."""
    single, index, pickled = (
        folder / "model.safetensors",
        folder / "model.safetensors.index.json",
        folder / "pytorch_model.bin",
    )
    if single.exists():
        return read_safetensors(single, FIX)
    if index.exists():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return {k: v for shard in shards for k, v in read_safetensors(folder / shard, FIX).items()}
    if pickled.exists():
        try:
            return torch.load(pickled, map_location="cpu", weights_only=True)
        except Exception as e:
            raise UserError(
                f"{pickled}: cannot be read safely with weights_only=True ({e}); convert it to safetensors"
            ) from None
    raise UserError(f"{folder}: no model.safetensors, model.safetensors.index.json or pytorch_model.bin")


def to_draftsmith_keys(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """EAGLE / SpecForge / speculators / ModelOpt names -> draftsmith names. A later layer's
    `hidden_norm` (vLLM builds one in every layer and uses layer 0's alone) is dropped."""
    out = {
        to_draftsmith_key(key): value
        for key, value in tensors.items()
        if not (key.endswith(IGNORED_SUFFIXES) or key.startswith(IGNORED_PREFIXES))
    }
    return {k: v for k, v in out.items() if not (k.startswith(EXTRA_PREFIX) and k.endswith(".hidden_norm.weight"))}


def read_aux_layer_ids(
    config: dict[str, Any], speculators: bool, convention: str | None, where: Path
) -> tuple[list[int], str]:
    """The auxiliary layer ids in draftsmith's convention, and a note on where they came from."""
    fields = {
        TOP_LEVEL_IDS: config.get(TOP_LEVEL_IDS),
        NESTED_IDS: (config.get("eagle_config") or {}).get(TOP_LEVEL_IDS),
    }
    present = {f: [int(k) for k in ids] for f, ids in fields.items() if ids}
    if not present:
        raise UserError(
            f"{where}: config.json names no auxiliary layers (eagle_config.eagle_aux_hidden_state_layer_ids); "
            "add them in SGLang's convention (the EAGLE reference used [1, L//2-1, L-4] there)"
        )
    record = config.get(RECORD_KEY)
    if record:
        conventions = record["layer_id_conventions"]
        mapped = {f: from_engine(ids, conventions[f]) for f, ids in present.items() if f in conventions}
        if not mapped or any(ids != record["aux_layer_ids"] for ids in mapped.values()):
            raise UserError(
                f"{where}: the layer ids in config.json {present} disagree with draftsmith's record {record}"
            )
        return list(record["aux_layer_ids"]), f"draftsmith record ({conventions})"
    field = TOP_LEVEL_IDS if speculators or NESTED_IDS not in present else NESTED_IDS
    guess = convention or ("vllm" if field == TOP_LEVEL_IDS else "sglang")
    return from_engine(present[field], guess), f"{field} read in the {guess} convention"


def rope_theta(llama: dict[str, Any], where: Path) -> float:
    scaling = llama.get("rope_scaling") or llama.get("rope_parameters") or {}
    kind = scaling.get("rope_type") or scaling.get("type") or "default"
    if kind != "default":
        raise UserError(f"{where}: rope scaling {kind!r} is not supported by draftsmith's drafter (plain RoPE only)")
    return float(llama.get("rope_theta") or scaling.get("rope_theta") or 10000.0)


def read_arch_options(config: dict[str, Any], speculators: bool) -> dict[str, bool]:
    """The architecture options where vLLM reads them, with vLLM's defaults (see the module docstring)."""
    options = {name: config.get(name, speculators and name == "norm_before_residual") for name in ARCH_OPTIONS}
    options["norm_before_fc"] = (config.get("eagle_config") or {}).get("norm_before_fc", options["norm_before_fc"])
    return {name: bool(on) for name, on in options.items()}


def drafter_config(config: dict[str, Any], speculators: bool, ids: list[int], where: Path) -> DrafterConfig:
    llama = config["transformer_layer_config"] if speculators else config
    heads = int(llama["num_attention_heads"])
    hidden = int(llama["hidden_size"])
    return DrafterConfig(
        hidden_size=hidden,
        intermediate_size=int(llama["intermediate_size"]),
        num_attention_heads=heads,
        num_key_value_heads=int(llama.get("num_key_value_heads") or heads),
        head_dim=int(llama.get("head_dim") or hidden // heads),
        vocab_size=int(llama["vocab_size"]),
        draft_vocab_size=int(config.get("draft_vocab_size") or llama["vocab_size"]),
        target_hidden_size=int(config.get("target_hidden_size") or llama.get("target_hidden_size") or hidden),
        aux_layer_ids=ids,
        rms_norm_eps=float(llama.get("rms_norm_eps", 1e-6)),
        rope_theta=rope_theta(llama, where),
        max_position_embeddings=int(llama.get("max_position_embeddings", 4096)),
        hidden_act=str(llama.get("hidden_act", "silu")),
        num_layers=int(llama.get("num_hidden_layers") or 1),
        **read_arch_options(config, speculators),
    )


def vocab_maps(state: dict[str, torch.Tensor], cfg: DrafterConfig, where: Path) -> None:
    """Make sure `state` holds d2t and t2d: identity maps for a full draft vocab, t2d rebuilt
    from d2t when only t2d is missing; anything else is an error."""
    if "d2t" not in state:
        if cfg.draft_vocab_size != cfg.vocab_size:
            raise UserError(
                f"{where}: the checkpoint has no d2t/t2d, but its draft vocab ({cfg.draft_vocab_size}) is smaller "
                f"than the target vocab ({cfg.vocab_size}): without d2t the draft ids cannot be mapped to target ids. "
                "Add the d2t and t2d tensors the drafter was trained with (`draftsmith vocab` writes them)"
            )
        state["d2t"] = torch.zeros(cfg.draft_vocab_size, dtype=torch.long)
        state["t2d"] = torch.ones(cfg.vocab_size, dtype=torch.bool)
    if "t2d" not in state:
        d2t = state["d2t"].long()
        t2d = torch.zeros(cfg.vocab_size, dtype=torch.bool)
        t2d[(torch.arange(d2t.numel()) + d2t).clamp(0, cfg.vocab_size - 1)] = True
        state["t2d"] = t2d
    check_vocab(cfg, state["d2t"], state["t2d"], str(where))


def load_weights(model: Eagle3Drafter, state: dict[str, torch.Tensor], where: Path) -> bool:
    """Copy `state` into `model` after checking names and shapes. Returns whether embeddings were present."""
    expected = model.state_dict()
    unexpected = sorted(set(state) - set(expected))
    missing = sorted(set(expected) - set(state) - {"embed_tokens.weight"})
    if unexpected or missing:
        raise UserError(
            f"{where}: weights do not match an EAGLE-3 drafter (missing {missing}, unexpected {unexpected})"
        )
    wrong = {k: (tuple(v.shape), tuple(expected[k].shape)) for k, v in state.items() if v.shape != expected[k].shape}
    if wrong:
        raise UserError(
            f"{where}: tensor shapes disagree with config.json (got, expected): {wrong}; a vocab size or hidden "
            "size in config.json does not match the weights"
        )
    model.load_state_dict(state, strict=False)
    return "embed_tokens.weight" in state


def import_drafter(path: Path, convention: str | None = None) -> tuple[Eagle3Drafter, dict[str, Any]]:
    """An EAGLE-3 folder -> (drafter on CPU in eval mode, record {config, target, meta} as in drafter.json)."""
    path = Path(path)
    config_path = path / "config.json"
    try:
        config = json.loads(config_path.read_text())
    except (OSError, ValueError) as e:  # ValueError: not JSON, or not UTF-8
        raise UserError(f"{config_path}: cannot be read as JSON ({e}); {FIX}") from None
    if not isinstance(config, dict):
        raise UserError(f"{config_path}: expected a JSON object (a model config); {FIX}")
    speculators = "speculators_model_type" in config
    if speculators and config["speculators_model_type"] not in SPECULATORS_TYPES:
        raise UserError(
            f"{config_path}: speculators_model_type {config['speculators_model_type']!r} is not one of {SPECULATORS_TYPES}"
        )
    if not speculators and not any("eagle3" in a.lower() for a in config.get("architectures", [])):
        raise UserError(f"{config_path}: architectures {config.get('architectures')} are not an EAGLE-3 drafter")
    state = to_draftsmith_keys(read_weights(path))
    ids, ids_source = read_aux_layer_ids(config, speculators, convention, path)
    cfg = replace(
        drafter_config(config, speculators, ids, path),
        **read_method(config, speculators, "mask_hidden" in state, str(config_path)),
    )
    if "fc.weight" in state and state["fc.weight"].shape[1] != len(ids) * cfg.target_hidden_size:
        raise UserError(
            f"{path}: fc.weight takes {state['fc.weight'].shape[1]} inputs but {len(ids)} layers x "
            f"target_hidden_size {cfg.target_hidden_size} = {len(ids) * cfg.target_hidden_size}"
        )
    extra = {int(k.split(".")[1]) for k in state if k.startswith(EXTRA_PREFIX)}  # layers 1.. that have weights
    if len(extra) + 1 != cfg.num_layers:
        raise UserError(
            f"{path}: config.json says num_hidden_layers {cfg.num_layers}, but the weights hold {len(extra) + 1} "
            f"decoder layer(s) (midlayer / layers.0{''.join(f', layers.{i + 1}' for i in sorted(extra))}); {FIX}"
        )
    vocab_maps(state, cfg, path)
    model = Eagle3Drafter(cfg)
    has_embeddings = load_weights(model, state, path)
    meta = {
        "imported_from": str(path),
        "layout": "speculators" if speculators else "eagle",
        "layer_ids_from": ids_source,
        "needs_target_embeddings": not has_embeddings,
    }
    target = (config.get(RECORD_KEY) or {}).get("target") or {}
    return model.eval(), {"config": cfg.to_dict(), "target": target, "meta": meta}
