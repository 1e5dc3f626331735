"""`train`'s part of each drafter method (draft/methods.py): how to build a fresh drafter of it,
and its objective, the one training step the trainer drives (`Objective`).

    OBJECTIVES[name].drafter(target, aux_layer_ids, d2t, t2d, cfg)   a drafter shaped by the target
    OBJECTIVES[name].objective(drafter, head, cfg, attention)         its step (`Objective`)

EAGLE-3 and P-EAGLE train through TTT's unroll (loss.py's `TTTObjective`; P-EAGLE's steps k >= 1
read its placeholder slots, ttt.py), DFlash through its block objective (dflash.py). The trainer
(loop.py) and `train.run` read no method: only this table and the `Objective` protocol.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

import torch
from torch import nn

from draftsmith.draft.dflash import DFlashConfig, DFlashDrafter, default_mask_token
from draftsmith.draft.model import DrafterConfig, Eagle3Drafter
from draftsmith.runtime.head import OutputHead, output_head
from draftsmith.target import Target, embed_weight, final_norm, text_config
from draftsmith.train.config import TrainConfig
from draftsmith.train.dflash import DFlashObjective
from draftsmith.train.loss import TTTObjective


class Objective(Protocol):
    """One training (or validation, in eval mode) step of a drafter: an nn.Module whose call on a
    batch (ids, loss_mask, doc, pos [B, T]; aux [B, T, n_aux*H_t]; final [B, T, H_t], in that
    order) returns the weighted loss and per-step counts {key: [K]} (loss.py's STEP_KEYS, plus
    walk_cycles and walk_reach), which `metrics.summarise` turns into the metric record."""

    drafter: nn.Module
    attention: str  # the step's attention, for the run's first log line
    static_shapes: bool  # rows padded to --batch-tokens: the step has fixed shapes (compiled flex, static step)
    reached_only: bool  # ce_sum covers only the positions a greedy chain reaches (its counts' n_chain)
    loss: str  # the objective's metric name: ce, tv or lk

    def compiled_on(self, device: torch.device) -> bool:
        """Whether its step runs compiled on `device` (then validation keeps gradients on)."""
        ...

    def __call__(self, *batch: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]: ...


def init_head(drafter: nn.Module, target: Target, d2t: torch.Tensor, cfg: TrainConfig) -> None:
    """--head-init target and --freeze-head, for any method's drafter (`lm_head`, `norm`)."""
    if cfg.head_init == "target":
        draft_ids = torch.arange(d2t.numel()) + d2t  # [Vd] target ids
        head = output_head(target.model)
        with torch.no_grad():
            drafter.lm_head.weight.copy_(head.scale * head.weight[draft_ids.to(head.weight.device)].float())
            drafter.norm.weight.copy_(final_norm(target.model).weight.detach().float())
    if cfg.freeze_head:
        drafter.lm_head.weight.requires_grad_(False)
        drafter.norm.weight.requires_grad_(False)


def fitted(drafter: nn.Module, target: Target, d2t: torch.Tensor, t2d: torch.Tensor, cfg: TrainConfig) -> nn.Module:
    """A fresh drafter given the target's embeddings (frozen, unless --train-embedding), the draft
    vocab and its head."""
    drafter.load_target_embeddings(embed_weight(target.model).detach().float())
    drafter.embed_tokens.weight.requires_grad_(cfg.train_embedding)
    drafter.set_vocab(d2t, t2d)
    init_head(drafter, target, d2t, cfg)
    return drafter


def eagle3_config(target: Target, aux_layer_ids: list[int], d2t: torch.Tensor, cfg: TrainConfig) -> DrafterConfig:
    """The EAGLE-3 module's config: target-shaped layers (--num-layers of them, --intermediate-size
    wide) with the architecture options of `cfg`."""
    shape = cfg.shaped(DrafterConfig.from_target(text_config(target.model.config), d2t.numel(), aux_layer_ids))
    return replace(
        shape, **{k: getattr(cfg, k) for k in ("norm_before_fc", "fc_norm", "norm_output", "norm_before_residual")}
    )


def eagle3_drafter(
    target: Target, aux_layer_ids: list[int], d2t: torch.Tensor, t2d: torch.Tensor, cfg: TrainConfig
) -> Eagle3Drafter:
    """An EAGLE-3 drafter; with --head-init target, the target's final norm and the draft rows of
    its lm_head times the head's logit scale (the drafter's head has no bias or soft-cap)."""
    return fitted(Eagle3Drafter(eagle3_config(target, aux_layer_ids, d2t, cfg)), target, d2t, t2d, cfg)


def placeholder_token(config: Any) -> int:
    """P-EAGLE's placeholder token: the target's pad token, else its end-of-sequence token, else 0
    (any target id serves: its embedding is the target's, frozen, and the slots learn around it)."""
    for name in ("pad_token_id", "eos_token_id"):
        tok = getattr(config, name, None)
        tok = tok[0] if isinstance(tok, list) and tok else tok
        if isinstance(tok, int) and tok >= 0:
            return tok
    return 0


def peagle_drafter(
    target: Target, aux_layer_ids: list[int], d2t: torch.Tensor, t2d: torch.Tensor, cfg: TrainConfig
) -> Eagle3Drafter:
    """A P-EAGLE drafter: EAGLE-3's module with the placeholder token of its parallel slots (and,
    from its method, their learned `mask_hidden`)."""
    dcfg = replace(
        eagle3_config(target, aux_layer_ids, d2t, cfg),
        method="peagle",
        ptd_token_id=placeholder_token(text_config(target.model.config)),
    )
    return fitted(Eagle3Drafter(dcfg), target, d2t, t2d, cfg)


def dflash_drafter(
    target: Target, aux_layer_ids: list[int], d2t: torch.Tensor, t2d: torch.Tensor, cfg: TrainConfig
) -> DFlashDrafter:
    """A block drafter of --num-layers target-shaped layers (--intermediate-size wide), --depth
    mask slots, the target's embeddings (frozen; the mask token's row is the target's own) and,
    with --head-init target, the target's final norm and head rows, as for EAGLE-3."""
    tc = text_config(target.model.config)
    shape = cfg.shaped(DrafterConfig.from_target(tc, d2t.numel(), aux_layer_ids))
    dcfg = DFlashConfig.from_target(
        tc, d2t.numel(), aux_layer_ids, default_mask_token(t2d, tc.vocab_size), cfg.depth + 1
    )
    dcfg = replace(dcfg, intermediate_size=shape.intermediate_size, num_layers=shape.num_layers)
    return fitted(DFlashDrafter(dcfg), target, d2t, t2d, cfg)


def ttt_objective(drafter: nn.Module, head: OutputHead, cfg: TrainConfig, attention: str) -> TTTObjective:
    """TTT's unroll of --depth steps with `attention` (eager or flex) and cfg's loss options."""
    return TTTObjective(
        drafter,
        head,
        cfg.depth,
        attention,
        cfg.loss_chunk,
        cfg.step_decay,
        cfg.aux_noise,
        static=bool(cfg.compile_step),
        all_tokens=cfg.loss_tokens == "all",
        reached_only=cfg.ttt_positions == "reached",
        teacher_temperature=cfg.teacher_temperature,
        loss=cfg.loss,
        lk_eta=cfg.lk_eta,
    )


def dflash_objective(drafter: nn.Module, head: OutputHead, cfg: TrainConfig, attention: str) -> DFlashObjective:
    """Blocks of --depth + 1 anchored in each row: --anchors of them (every answer position with
    `all`), by default about as many queries as the row has tokens; forwards of at most that many."""
    chunk = max(cfg.batch_tokens // (cfg.depth + 1), 1)
    return DFlashObjective(
        drafter,
        head,
        cfg.loss_chunk,
        cfg.step_decay,
        anchors=None if cfg.anchors == "all" else cfg.anchors or chunk,
        anchor_chunk=chunk,
        all_tokens=cfg.loss_tokens == "all",
        teacher_temperature=cfg.teacher_temperature,
    )


@dataclass(frozen=True)
class Training:
    """A method's part of `train`. `ttt`: its step is TTT's unroll, whose attention --attention
    picks (and whose eager scores' memory `train` checks before it starts); `compiled_step`: it has
    a static, compiled step (--compile-step's GPU default); `first_drafted`: the position in a
    sample of the first token its drafter drafts (a sample shorter than that trains nothing);
    `step_label(depth)`: its step's name in `plan`'s report."""

    drafter: Callable[[Target, list[int], torch.Tensor, torch.Tensor, TrainConfig], nn.Module]
    objective: Callable[[nn.Module, OutputHead, TrainConfig, str], Objective]
    ttt: bool
    compiled_step: bool
    first_drafted: int
    step_label: Callable[[int], str]


def ttt_label(depth: int) -> str:
    return f"TTT-{depth}"


def block_label(depth: int) -> str:
    return f"DFlash block-{depth + 1}"


OBJECTIVES: dict[str, Training] = {
    "eagle3": Training(eagle3_drafter, ttt_objective, True, True, 2, ttt_label),
    "peagle": Training(peagle_drafter, ttt_objective, True, True, 2, ttt_label),
    "dflash": Training(dflash_drafter, dflash_objective, False, False, 1, block_label),
}
