"""`draftsmith export` of a DFlash drafter: vLLM's `qwen3_dflash` layout (draft/dflash_layout.py).

    config.json        Qwen3 fields, architectures ["DFlashDraftModel"], draft_vocab_size,
                       target_hidden_size, block_size, dflash_config {mask_token_id,
                       target_layer_ids (layer outputs: draftsmith's ids - 1)}, draftsmith {...}
    model.safetensors  fc, hidden_norm, layers.{i}.*, norm, lm_head, d2t, t2d (these two only for a
                       smaller draft vocab: export/run.py) (+ embed_tokens with --include-embeddings)
    README.md          the model card, with the `vllm serve` command

Engines: vLLM serves this layout (`--speculative-config '{"method": "dflash", ...}'`; checked by
tests/e2e/test_vllm_agreement.py against `draftsmith eval`). SGLang's DFlashDraftModel is
refused (draft/methods.py: DFlash's `engines`): it has no lm_head or d2t of its own and drafts
through the target's full-vocab head, so it would drop this drafter's trained draft-vocab head.
The `speculators` format has no DFlash layout in draftsmith (export/run.py's `WRITERS`). Both are
refused before anything is written.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch

from draftsmith.draft.dflash import DFlashDrafter
from draftsmith.draft.dflash_layout import ARCHITECTURE, import_dflash, target_layer_ids
from draftsmith.draft.layouts import RECORD_KEY, check_vocab
from draftsmith.draft.methods import check_depth
from draftsmith.errors import UserError
from draftsmith.export.config import ExportConfig
from draftsmith.export.writer import Files
from draftsmith.layers import validate_layers


def dflash_config(model: DFlashDrafter, dtype: str, target: dict[str, Any]) -> dict[str, Any]:
    c = model.config
    return {
        "architectures": [ARCHITECTURE],
        "model_type": "qwen3",
        "vocab_size": c.vocab_size,
        "draft_vocab_size": c.draft_vocab_size,
        "hidden_size": c.hidden_size,
        "target_hidden_size": c.target_hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_hidden_layers": c.num_layers,
        "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads,
        "head_dim": c.head_dim,
        "hidden_act": c.hidden_act,
        "rms_norm_eps": c.rms_norm_eps,
        "max_position_embeddings": c.max_position_embeddings,
        "rope_theta": c.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": c.rope_theta},
        "attention_bias": False,
        "tie_word_embeddings": False,
        "torch_dtype": dtype,
        "block_size": c.block_size,
        "num_target_layers": target.get("num_layers"),
        "dflash_config": {"mask_token_id": c.mask_token_id, "target_layer_ids": target_layer_ids(c.aux_layer_ids)},
        RECORD_KEY: {
            "format_version": 1,
            "engine": "vllm",
            "method": "dflash",
            "aux_layer_ids": list(c.aux_layer_ids),
            "target": target,
        },
    }


def export_tensors(model: DFlashDrafter, include_embeddings: bool, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The state dict (its names are vLLM's), floats cast to `dtype`, embed_tokens only if asked."""
    return {
        k: (v.detach().cpu().to(dtype) if v.is_floating_point() else v.detach().cpu()).contiguous()
        for k, v in model.state_dict().items()
        if include_embeddings or k != "embed_tokens.weight"
    }


def model_card(model: DFlashDrafter, record: dict[str, Any], out: str, k: int) -> str:
    c, target = model.config, record.get("target") or {}
    name = str(target.get("name") or "TARGET")
    meta = record.get("meta") or {}
    spec = f'{{"method": "dflash", "model": "{out}", "num_speculative_tokens": {k}}}'
    lines = [
        f"# DFlash drafter for {name}",
        "",
        f"Exported by draftsmith for **vLLM** (`qwen3_dflash`, `{ARCHITECTURE}`): a block drafter of "
        f"{c.num_layers} Qwen3-style decoder layer(s), hidden size {c.hidden_size}, block size {c.block_size} "
        f"(the verified token and {c.drafts} mask slots, drafted in one forward), mask token id {c.mask_token_id}, "
        f"draft vocabulary {c.draft_vocab_size} of {c.vocab_size} target tokens.",
        "",
        f"- auxiliary layers (draftsmith: the stream entering layer k): {c.aux_layer_ids}; "
        f"`dflash_config.target_layer_ids` (layer outputs, as vLLM reads them): {target_layer_ids(c.aux_layer_ids)}",
        "- embeddings: the target's (vLLM shares them when the export has none)",
        *(
            f"- {key}: {meta[key]}"
            for key in ("method", "mode", "step", "simulated_tau", "train_samples")
            if key in meta
        ),
        "",
        "## Serve",
        "",
        "```bash",
        f"vllm serve {name} --speculative-config '{spec}'",
        "```",
        "",
        "SGLang is not a target of this export: its DFlashDraftModel drafts through the target's full-vocab head "
        "and would drop this drafter's own.",
        "",
    ]
    return "\n".join(lines)


@torch.no_grad()
def reload_check(model: DFlashDrafter, folder: Path, dtype: torch.dtype) -> None:
    """The written folder must import back to the same config and the same block logits."""
    reloaded, record = import_dflash(folder)
    expected = copy.deepcopy(model).to(dtype).float().eval()
    if record["meta"]["needs_target_embeddings"]:
        reloaded.load_target_embeddings(expected.embed_tokens.weight)
    if reloaded.config != expected.config:
        raise RuntimeError(f"export reload changed the config: {reloaded.config} != {expected.config}")
    c = expected.config
    g = torch.Generator().manual_seed(0)
    aux = torch.randn(1, 8, len(c.aux_layer_ids) * c.target_hidden_size, generator=g)  # [1, 8, n_aux*H_t]
    bonus = torch.randint(0, c.vocab_size, (1,), generator=g)
    pos = 8 + torch.arange(c.block_size)[None]
    mask = torch.ones(1, c.block_size, 8 + c.block_size, dtype=torch.bool)

    def logits(m: DFlashDrafter) -> torch.Tensor:
        kv = m.context_kv(m.context(aux), torch.arange(8)[None])
        return m.logits(m(m.block_ids(bonus), pos, kv, mask))

    got, want = logits(reloaded), logits(expected)
    if (
        not torch.equal(got, want)
        or not torch.equal(reloaded.d2t, model.d2t)
        or not torch.equal(reloaded.t2d, model.t2d)
    ):
        raise RuntimeError(
            f"export reload gives different logits or vocab maps (max diff {float((got - want).abs().max()):.3g})"
        )


def dflash_files(model: DFlashDrafter, record: dict[str, Any], cfg: ExportConfig, dtype: torch.dtype) -> Files:
    """The layout's files: its config, weights and model card, after the checks that no engine
    would serve this drafter as trained otherwise (its layers, its vocab, --depth)."""
    target = record.get("target") or {}
    try:
        validate_layers(list(model.config.aux_layer_ids), target.get("num_layers"), count=None)
    except UserError as e:
        raise UserError(f"this drafter's auxiliary layers cannot be served: {e}") from None
    check_vocab(model.config, model.d2t, model.t2d, str(cfg.drafter))
    k = cfg.depth or model.config.drafts
    check_depth(model.config, k)
    verifier = cfg.verifier or str(target.get("name") or "TARGET")
    config = dflash_config(model, str(dtype).removeprefix("torch."), target)
    card = model_card(model, {**record, "target": {**target, "name": verifier}}, str(Path(cfg.out).absolute()), k)
    ids = model.config.aux_layer_ids
    layers = f"{ids} draftsmith = target_layer_ids {target_layer_ids(ids)}"
    return Files(config, export_tensors(model, cfg.include_embeddings, dtype), card, "dflash", layers)
