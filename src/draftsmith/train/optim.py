"""The drafter's optimizer and learning-rate schedule (`--optimizer`, `--schedule`).

    adamw   AdamW (betas 0.9, 0.95) on every trainable parameter
    muon    Muon (torch.optim.Muon's algorithm, `Muon` below) on the hidden weight matrices
            (fc, attention, MLP), with its update scaled to AdamW's RMS (`match_rms_adamw`) so
            that one --lr means the same step size for both; AdamW on the rest (norms, lm_head),
            as Muon is meant for hidden matrices only

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


def orthogonalize(
    g: torch.Tensor, coefficients: tuple[float, float, float], steps: int, eps: float, dtype: torch.dtype
) -> torch.Tensor:
    """g [m, n] -> about its polar factor U V^T (singular values pushed to ~1, not exactly), in
    `dtype`: Muon's quintic Newton-Schulz iteration on the wide orientation of g."""
    a, b, c = coefficients
    x = g.to(dtype)
    tall = x.shape[0] > x.shape[1]
    if tall:
        x = x.T  # [n, m]: the Gram matrix below is the smaller square
    x = x / x.norm().clamp(min=eps)  # spectral norm <= 1
    for _ in range(steps):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.T if tall else x


class Muon(torch.optim.Muon):
    """torch.optim.Muon (its options, defaults and state: a checkpoint of either loads in the
    other), orthogonalising in `ns_dtype`. torch casts the update to bfloat16 on every device;
    that is what tensor cores want, but a CPU without bf16 matrix units (an AMD EPYC Zen 3 VM:
    bf16 matmuls 6x slower than fp32) took 26 s per quickstart step instead of 2 s. Default:
    bfloat16 on CUDA, as torch does, float32 elsewhere."""

    def __init__(self, params: Any, ns_dtype: torch.dtype | None = None, **options: Any) -> None:
        super().__init__(params, **options)
        self.ns_dtype = ns_dtype

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, mu = float(group["lr"]), group["momentum"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p.grad)
                buf = state["momentum_buffer"]
                buf.lerp_(p.grad, 1 - mu)
                update = p.grad.lerp(buf, mu) if group["nesterov"] else buf
                dtype = self.ns_dtype or (torch.bfloat16 if p.is_cuda else torch.float32)
                update = orthogonalize(update, group["ns_coefficients"], group["ns_steps"], group["eps"], dtype)
                p.mul_(1 - lr * group["weight_decay"])
                p.add_(update, alpha=-lr * rms_scale(group["adjust_lr_fn"], p.shape))
        return loss


def rms_scale(adjust_lr_fn: str | None, shape: torch.Size) -> float:
    """torch.optim.Muon's lr multiplier of an [A, B] matrix: `match_rms_adamw` gives the update
    AdamW's RMS (0.2 sqrt(max(A, B))); `original` (or None) sqrt(max(1, A / B))."""
    rows, cols = shape[:2]
    if adjust_lr_fn == "match_rms_adamw":
        return 0.2 * math.sqrt(max(rows, cols))
    return math.sqrt(max(1, rows / cols))


def is_hidden_matrix(name: str, param: nn.Parameter) -> bool:
    """Muon's parameters: 2-D weights inside the network, not the output head."""
    return param.ndim == 2 and "lm_head" not in name and "embed" not in name


class Optimizers:
    """One or two optimizers (and their schedulers) driven as one."""

    def __init__(
        self, model: nn.Module, kind: str, lr: float, weight_decay: float, schedule: str, total: int, warmup: int
    ) -> None:
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        if kind == "muon":
            matrices = [p for n, p in named if is_hidden_matrix(n, p)]
            rest = [p for n, p in named if not is_hidden_matrix(n, p)]
            self.optimizers: list[torch.optim.Optimizer] = [
                Muon(matrices, lr=lr, weight_decay=weight_decay, adjust_lr_fn="match_rms_adamw")
            ]
            if rest:
                self.optimizers.append(torch.optim.AdamW(rest, lr=lr, weight_decay=weight_decay, betas=ADAMW_BETAS))
        else:
            self.optimizers = [
                torch.optim.AdamW([p for _, p in named], lr=lr, weight_decay=weight_decay, betas=ADAMW_BETAS)
            ]
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
