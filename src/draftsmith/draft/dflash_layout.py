"""The DFlash folder layout that vLLM's `qwen3_dflash` reads, for the reader (`import_dflash`,
through `load_drafter`) and the writer (export/dflash.py).

    config.json    a Qwen3 config: architectures ["DFlashDraftModel"], model_type "qwen3",
                   num_hidden_layers (the drafter's layers), draft_vocab_size, target_hidden_size,
                   block_size,
                   dflash_config.mask_token_id       the token id of the mask slots
                   dflash_config.target_layer_ids    the aux layers as layer OUTPUTS (vLLM adds 1:
                                                     `get_eagle3_aux_layers_from_config`), i.e.
                                                     draftsmith's ids minus one
                   draftsmith: {...}                 draftsmith's own record (method, ids, target)
    weights        draftsmith's names are vLLM's: fc.weight, hidden_norm.weight, layers.{i}.*,
                   norm.weight, lm_head.weight, d2t (-> draft_id_to_target_id), t2d (skipped by
                   vLLM), embed_tokens.weight only with --include-embeddings (else vLLM shares
                   the target's)

The layers are Qwen3 decoder layers (q_norm, k_norm); vLLM builds them for the drafter whatever
the target's architecture: the target only has to expose aux hidden states (SupportsEagle3).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from draftsmith.draft.dflash import DFlashConfig, DFlashDrafter
from draftsmith.draft.importer import read_weights
from draftsmith.draft.layouts import RECORD_KEY, check_vocab
from draftsmith.errors import UserError

ARCHITECTURE = "DFlashDraftModel"
FIX = "re-export it with `draftsmith export`"


def is_dflash_folder(folder: Path) -> bool:
    """Whether `folder`'s config.json describes a DFlash drafter."""
    try:
        config = json.loads((Path(folder) / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and (
        ARCHITECTURE in (config.get("architectures") or []) or "dflash_config" in config
    )


def target_layer_ids(aux_layer_ids: list[int]) -> list[int]:
    """draftsmith's ids (the stream entering layer k) -> DFlash's target_layer_ids (layer outputs)."""
    return [k - 1 for k in aux_layer_ids]


def import_dflash(folder: Path) -> tuple[DFlashDrafter, dict[str, Any]]:
    """A DFlash folder (draftsmith's export, or a z-lab-style checkpoint in vLLM's layout) as a
    drafter and its record; without embed_tokens, `meta.needs_target_embeddings` is set."""
    folder = Path(folder)
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except ValueError as e:
        raise UserError(f"{folder}/config.json: corrupt ({e}); {FIX}") from None
    dflash = config.get("dflash_config") or {}
    if "mask_token_id" not in dflash or not dflash.get("target_layer_ids"):
        raise UserError(f"{folder}/config.json: a DFlash config needs dflash_config.mask_token_id and target_layer_ids")
    state = read_weights(folder)
    record = config.get(RECORD_KEY) or {}
    aux = list(record.get("aux_layer_ids") or [k + 1 for k in dflash["target_layer_ids"]])
    heads = int(config["num_attention_heads"])
    params = config.get("rope_parameters") or config.get("rope_scaling") or {}
    cfg = DFlashConfig(
        hidden_size=int(config["hidden_size"]),
        intermediate_size=int(config["intermediate_size"]),
        num_attention_heads=heads,
        num_key_value_heads=int(config.get("num_key_value_heads") or heads),
        head_dim=int(config.get("head_dim") or config["hidden_size"] // heads),
        vocab_size=int(config["vocab_size"]),
        draft_vocab_size=int(config.get("draft_vocab_size") or config["vocab_size"]),
        target_hidden_size=int(config.get("target_hidden_size") or config["hidden_size"]),
        aux_layer_ids=aux,
        mask_token_id=int(dflash["mask_token_id"]),
        block_size=int(config.get("block_size") or 16),
        rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
        rope_theta=float(params.get("rope_theta", config.get("rope_theta", 1e6))),
        max_position_embeddings=int(config.get("max_position_embeddings", 4096)),
        num_layers=int(config["num_hidden_layers"]),
    )
    model = DFlashDrafter(cfg)
    has_embed = "embed_tokens.weight" in state
    if "d2t" not in state:  # the full vocab: identity maps
        state["d2t"] = torch.zeros(cfg.draft_vocab_size, dtype=torch.long)
        state["t2d"] = torch.ones(cfg.vocab_size, dtype=torch.bool)
    if "t2d" not in state:
        t2d = torch.zeros(cfg.vocab_size, dtype=torch.bool)
        t2d[torch.arange(cfg.draft_vocab_size) + state["d2t"].long()] = True
        state["t2d"] = t2d
    state = {k.removeprefix("model."): v for k, v in state.items() if not k.endswith("rotary_emb.inv_freq")}
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if k != "embed_tokens.weight"]
    if missing or unexpected:
        raise UserError(
            f"{folder}: weights do not match its config (missing {missing}, unexpected {unexpected}); {FIX}"
        )
    check_vocab(cfg, model.d2t, model.t2d, str(folder))
    meta = {"needs_target_embeddings": not has_embed, "imported_from": str(folder), "method": "dflash"}
    return model, {"method": "dflash", "config": cfg.to_dict(), "target": record.get("target") or {}, "meta": meta}
