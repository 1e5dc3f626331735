"""The drafter's optimizer and learning-rate schedule (`--optimizer`, `--schedule`).

    adamw   AdamW (betas 0.9, 0.95) on every trainable parameter
    muon    torch.optim.Muon on the hidden weight matrices (fc, attention, MLP), with its
            update scaled to AdamW's RMS (`match_rms_adamw`) so that one --lr means the same
            step size for both; AdamW on the rest (norms, lm_head), as Muon is meant for
            hidden matrices only

    cosine    linear warm-up, then cosine decay to 0
    linear    linear warm-up, then linear decay to 0
    constant  linear warm-up, then constant

`Optimizers` steps, zeroes and saves one or two torch optimizers as one; each has its own
LambdaLR with the same factor.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

ADAMW_BETAS = (0.9, 0.95)


def lr_factor(schedule: str, total: int, warmup: int) -> Callable[[int], float]:
    """The multiplier of the peak lr after `step` optimizer steps."""

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min((step - warmup) / max(total - warmup, 1), 1.0)
        if schedule == "cosine":
            return 0.5 * (1 + math.cos(math.pi * progress))
        if schedule == "linear":
            return 1.0 - progress
        return 1.0

    return factor


def is_hidden_matrix(name: str, param: nn.Parameter) -> bool:
    """Muon's parameters: 2-D weights inside the network, not the output head."""
    return param.ndim == 2 and "lm_head" not in name and "embed" not in name


class Optimizers:
    """One or two optimizers (and their schedulers) driven as one."""

    def __init__(self, model: nn.Module, kind: str, lr: float, weight_decay: float, schedule: str, total: int,
                 warmup: int) -> None:
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        if kind == "muon":
            matrices = [p for n, p in named if is_hidden_matrix(n, p)]
            rest = [p for n, p in named if not is_hidden_matrix(n, p)]
            self.optimizers: list[torch.optim.Optimizer] = [
                torch.optim.Muon(matrices, lr=lr, weight_decay=weight_decay, adjust_lr_fn="match_rms_adamw")]
            if rest:
                self.optimizers.append(torch.optim.AdamW(rest, lr=lr, weight_decay=weight_decay, betas=ADAMW_BETAS))
        else:
            self.optimizers = [torch.optim.AdamW([p for _, p in named], lr=lr, weight_decay=weight_decay,
                                                 betas=ADAMW_BETAS)]
        factor = lr_factor(schedule, total, warmup)
        self.schedulers = [torch.optim.lr_scheduler.LambdaLR(o, factor) for o in self.optimizers]

    def step(self) -> None:
        for opt, sched in zip(self.optimizers, self.schedulers, strict=True):
            opt.step()
            sched.step()

    def zero_grad(self) -> None:
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=True)

    @property
    def lr(self) -> float:
        return self.schedulers[0].get_last_lr()[0]

    def scheduler_state(self) -> list[dict[str, Any]]:
        return [s.state_dict() for s in self.schedulers]

    def load_scheduler_state(self, states: list[dict[str, Any]]) -> None:
        for sched, state in zip(self.schedulers, states, strict=True):
            sched.load_state_dict(state)
