"""P-EAGLE (parallel drafting, arXiv 2602.01469): the EAGLE-3 drafter proposing all K drafts in
one forward, with the inputs vLLM gives it. No I/O here.

vLLM 0.32 serves it with `llama_eagle3` and `speculative_config` `parallel_drafting=True`
(v1/spec_decode/llm_base_proposer.py, `_copy_and_expand_eagle_inputs`): the drafter's one forward
per cycle runs over the newly verified positions with EAGLE-3's inputs (the target's aux states at
t, the token t+1, position t; the last one's token is the bonus token), followed by K-1
placeholder slots. Slot k (1..K-1) of a cycle whose last verified position is t gets

    hidden     project(mask_hidden)    the learned placeholder of the aux states [n_aux*H_t] (vLLM's
                                       `mask_hidden` buffer), through the same aux norms and fc as the
                                       target's states (vLLM's `combine_hidden_states`)
    token      ptd_token_id            a target token id (config.json `ptd_token_id` / `pard_token`),
                                       embedded by the (frozen, the target's) embedding
    position   pos[t] + k
    attention  causal: the context up to t and slots 1..k

and the output at t is draft 1, slot k's draft k+1. No step reads another step's output.

Training is TTT's unroll (train/ttt.py) with these inputs at its steps k >= 1: the TTT mask (step-0
keys at s <= t of the sample, the step-1..k keys at t only) is exactly the attention above, so
step k at every t is slot k of a cycle whose last verified position is t, scored against token
t+2+k like EAGLE-3's step k. P-EAGLE's own trainers subsample the positions of deeper slots
(COD, to save compute); here every position trains at every depth.
"""

from __future__ import annotations

import torch

from draftsmith.draft.layouts import arch_options
from draftsmith.draft.model import DrafterConfig, Eagle3Drafter
from draftsmith.errors import UserError

METHOD = "peagle"  # its name in draft/methods.py's METHODS
SPECULATORS_TYPES = ("eagle3", METHOD)  # the speculators_model_type values of the EAGLE-3 module's layouts


def placeholder_hidden(drafter: Eagle3Drafter) -> torch.Tensor:
    """The hidden state [H] of every parallel slot: `mask_hidden` projected like the target's aux states."""
    assert drafter.mask_hidden is not None, "not a P-EAGLE drafter"
    return drafter.project(drafter.mask_hidden[None])[0]  # [H]


def placeholder_inputs(
    drafter: Eagle3Drafter, ids: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """The inputs of parallel slots shaped like ids [B, T]: token ids [B, T] (all ptd_token_id)
    and hidden states [B, T, H] (all `placeholder_hidden`)."""
    h = placeholder_hidden(drafter).to(dtype)  # [H]
    return torch.full_like(ids, drafter.config.ptd_token_id), h.expand(*ids.shape, h.shape[-1])  # [B, T], [B, T, H]


# config.json fields that name the placeholder token, in the order vLLM's proposer reads them
# (`_init_parallel_drafting_params`; speculators' `mask_token_id` becomes `pard_token`)
TOKEN_FIELDS = ("mask_token_id", "pard_token", "ptd_token_id")


def speculators_fields(cfg: DrafterConfig) -> tuple[dict[str, object], dict[str, object]]:
    """P-EAGLE's fields in the speculators layout (empty for EAGLE-3): in transformer_layer_config,
    the architecture options (vLLM's `update_peagle` copies only norm_before_residual and
    norm_before_fc from the top level); at the top level, the placeholder token as `mask_token_id`
    (which `update_peagle` requires, as pard_token)."""
    if cfg.method != METHOD:
        return {}, {}
    return arch_options(cfg), {"mask_token_id": cfg.ptd_token_id}


def engine_fields(cfg: DrafterConfig) -> dict[str, int]:
    """The placeholder token under the names vLLM reads in an EAGLE-3 config.json (empty for EAGLE-3)."""
    return {"pard_token": cfg.ptd_token_id, "ptd_token_id": cfg.ptd_token_id} if cfg.method == METHOD else {}


def read_method(config: dict, speculators: bool, has_mask_hidden: bool, where: str) -> dict[str, object]:
    """The method fields of DrafterConfig from an engine's config.json (a speculators `peagle`, or
    an EAGLE-3 config with a placeholder token) and whether its weights hold `mask_hidden`."""
    token = next((config[name] for name in TOKEN_FIELDS if config.get(name) is not None), None)
    parallel = (config.get("speculators_model_type") == "peagle") if speculators else token is not None
    if not parallel and not has_mask_hidden:
        return {"method": "eagle3"}
    if token is None or not has_mask_hidden:
        missing = "a placeholder token (mask_token_id, pard_token or ptd_token_id)" if token is None else "mask_hidden"
        raise UserError(f"{where}: a P-EAGLE (parallel drafting) drafter without {missing}; vLLM refuses it too")
    return {"method": METHOD, "ptd_token_id": int(token)}
