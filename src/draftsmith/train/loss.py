"""The TTT objective: unroll the drafter K steps and score every step against the target.

Per step k (see `ttt.py` for the alignment), over the valid positions only:

    teacher  p = softmax(head(final[t+1+k])[draft ids] / τ_T)      the target, on the draft vocab
                                                                   (τ_T: --teacher-temperature in
                                                                   training, 1 in validation)
    student  z = lm_head_draft(norm(out_k[t]))
    ce_k     = Σ_t (logsumexp(z) - Σ_v p z) / n_valid_k            = -Σ_v p log softmax(z), as Σ_v p = 1
    loss     = Σ_k step_decay**k ce_k              (draft/step_weights.py; step_decay 0.8 by default)

With train --loss tv or lk, ce_k gives way to another per-position objective (`_chunk_acceptance`),
averaged and weighted the same way; q = softmax(z), α = Σ_v min(p, q) = 1 - TV(p, q) (the chance
that speculative sampling accepts a draft from q, with p the target's probabilities on the draft vocab):
    tv:  TV(p, q) = ½ Σ_v |p - q| = 1 - α                  (minimising it maximises expected acceptance)
    lk:  λ KL(p‖q) + (1 - λ) TV(p, q),  λ = exp(-η·sg[α])   (LK^λ of "LK Losses", arXiv 2602.23881: a blend
         of the soft CE's KL, which leads while α is small, and TV, which takes over as α grows; η = --lk-eta)
KL(p‖q) = ce - H(p): the same gradient as the soft CE. The soft CE is still summed (`ce_sum`, logged
as `loss_k`) and the objective goes to `obj_sum` (zero under ce, where ce_sum is the objective).

Valid = same sample × loss_mask[t+2+k] × t2d[argmax of the target's full-vocab logits at t+1+k]
(loss_mask: prepare's answer mask; in training with --loss-tokens all, every token of the sample).
ce_k sums over the trained positions: every valid one, or with --ttt-positions reached only those
that a greedy chain reaches at step k (steps 0..k-1 valid and drafting the teacher's argmax
there: the positions whose step-k acceptance counts in τ, GRIFFIN's token alignment), and is
divided by their count: n_valid_k, or n_chain_k below.

`head` is the target's own output path (runtime/head.py: final @ lm_headᵀ + bias, then the
model's scaling or soft-capping), which `train` checks against the model's logits before it
starts. The transform is elementwise and monotonic: it commutes with taking the draft rows, and
the argmax needs only the linear part.

Cost. The teacher at position s is the same for every step that reads final[s], so its logits
are computed once per batch, for the positions some step uses, and kept in the matmul's dtype
(bf16 under autocast) with their logsumexp (`Teacher`). The student's vocab-sized part is
`SoftCE`, an autograd Function that walks `chunk` rows at a time and, in the same pass, makes
the gradient `softmax(z) - p` (for tv and lk, theirs): its output is a sum, so backward only
scales the saved dx [n, H] and dW [Vd, H]. No [n, Vd] fp32 tensor outlives a chunk and no logits
are recomputed. On CUDA the per-chunk elementwise work is compiled into a few fused kernels.

Static form (`TTTObjective(static=True)`, train --compile-step). The same loss and counts with
fixed shapes and no host sync: the teacher and the student rows at every position of the row,
the valid ones selected (`keep`) inside SoftCE's chunks instead of compacted by boolean
indexing. On CUDA the student's part (unroll, loss, backward) is one torch.compile region, with
SoftCE's forward pass an opaque op in it (`_soft_ce_op`), so the chunking holds there too.

Counts per step (for metrics): n_valid, n_correct (student argmax == teacher argmax), and the
chained counts for cond_acc: positions whose steps 0..k-1 were all valid and correct (n_chain,
also the count of the positions that --ttt-positions reached trains on). In validation also the walked counts (`walk.walk_counts`:
the answers decoded as a chain of K drafts would decode them, cycle by cycle); zero in training.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import nn

from draftsmith.draft.step_weights import STEP_DECAY, step_weights
from draftsmith.runtime.head import OutputHead
from draftsmith.train.ttt import shift_left, unroll, valid_steps
from draftsmith.train.walk import walk_counts

# counted at every step's positions; obj_sum: the --loss objective's sum where it is not the soft CE
STEP_KEYS = ("ce_sum", "n_valid", "n_correct", "n_chain", "n_chain_correct", "obj_sum")
LOSSES = ("ce", "tv", "lk")  # train --loss
LK_ETA = 3.0  # train --lk-eta: η of LK^λ's weight exp(-η α) (speculators' default, reported as the paper's best)
STAT_KEYS = (*STEP_KEYS, "walk_cycles", "walk_reach")


def matmul_dtype(device: torch.device, dtype: torch.dtype) -> torch.dtype:
    """The dtype that matmuls of `dtype` tensors run in here: autocast's when it is on."""
    return torch.get_autocast_dtype(device.type) if torch.is_autocast_enabled(device.type) else dtype


@torch.no_grad()
def argmax_in_draft_vocab(rows: torch.Tensor, head: OutputHead, t2d: torch.Tensor, chunk: int) -> torch.Tensor:
    """rows [n, H] target final states -> [n] bool: the target's argmax (over its full vocab) is
    a draft token. `chunk` rows at a time, so that no [n, V] logits exist at once."""
    ok = torch.empty(rows.shape[0], dtype=torch.bool, device=rows.device)
    for a in range(0, rows.shape[0], chunk):
        ok[a : a + chunk] = t2d[head.linear(rows[a : a + chunk]).argmax(-1)]
    return ok


@torch.no_grad()
def teacher_in_draft_vocab(
    final: torch.Tensor, head: OutputHead, t2d: torch.Tensor, where: torch.Tensor, chunk: int
) -> torch.Tensor:
    """[B, T] bool: `argmax_in_draft_vocab` of final [B, T, H], computed only where `where`
    [B, T] is set (positions followed by a trained token); False elsewhere."""
    out = torch.zeros(where.shape, dtype=torch.bool, device=final.device)
    out[where] = argmax_in_draft_vocab(final[where], head, t2d, chunk)
    return out


class Teacher(NamedTuple):
    """The target's distribution on the draft vocab at m positions."""

    logits: torch.Tensor  # [m, Vd], in the matmul dtype
    lse: torch.Tensor  # [m] fp32: logsumexp of the logits
    top: torch.Tensor  # [m]: argmax of the logits


@torch.no_grad()
def teacher_table(rows: torch.Tensor, draft_head: OutputHead, chunk: int, temperature: float = 1.0) -> Teacher:
    """rows [m, H_t] target final states -> their `Teacher` through the target's head on the
    draft rows (`draft_head`, [Vd] outputs), its logits divided by `temperature` (below 1: a
    sharper teacher; the argmax is the same), `chunk` rows at a time. The transform runs in fp32."""
    m = rows.shape[0]
    logits = rows.new_empty((m, draft_head.weight.shape[0]), dtype=matmul_dtype(rows.device, draft_head.weight.dtype))
    lse = rows.new_empty(m, dtype=torch.float32)
    top = rows.new_empty(m, dtype=torch.long)
    for a in range(0, m, chunk):
        raw = draft_head.transform(draft_head.linear(rows[a : a + chunk]).float())  # [c, Vd]
        logits[a : a + chunk] = raw if temperature == 1.0 else raw / temperature  # no extra pass by default
        z = logits[a : a + chunk].float()  # as stored, so that the teacher's probabilities sum to 1
        lse[a : a + chunk] = torch.logsumexp(z, dim=-1)
        top[a : a + chunk] = z.argmax(-1)
    return Teacher(logits, lse, top)


def _chunk_ce(
    x: torch.Tensor,
    w: torch.Tensor,
    t_logits: torch.Tensor,
    t_lse: torch.Tensor,
    rows: torch.Tensor,
    with_grad: bool,
    keep: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """One chunk of c student rows x [c, H] against the teacher rows `rows` [c] of t_logits [m, Vd]
    and t_lse [m]; x and the lm_head weight w [Vd, H] come in the matmul dtype. `keep` [c] bool:
    the rows that count (ce and gradient zero elsewhere, by selection, so that nothing from a
    row left out can leak in); None: all.
    Returns ce [c] fp32, the student's argmax [c], and dce/dz [c, Vd] in the matmul dtype (or None)."""
    z = (x @ w.T).float()  # [c, Vd] student logits
    p = torch.exp(t_logits[rows].float() - t_lse[rows, None])  # [c, Vd] teacher probabilities
    lse = torch.logsumexp(z, dim=-1)  # [c]
    ce = lse - (p * z).sum(-1)  # [c]
    dz = (torch.exp(z - lse[:, None]) - p) if with_grad else None  # [c, Vd]: softmax(z) - p
    if keep is not None:
        ce = torch.where(keep, ce, 0.0)
        dz = torch.where(keep[:, None], dz, 0.0) if with_grad else None
    return ce, z.argmax(-1), dz.to(x.dtype) if with_grad else None


def _chunk_acceptance(
    x: torch.Tensor,
    w: torch.Tensor,
    t_logits: torch.Tensor,
    t_lse: torch.Tensor,
    rows: torch.Tensor,
    with_grad: bool,
    keep: torch.Tensor | None = None,
    eta: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """`_chunk_ce`'s chunk for train --loss tv (`eta` None) or lk (η = `eta`), same arguments ->
    the objective [c] fp32, ce [c] fp32 (logged), the student's argmax [c], and d objective/dz
    [c, Vd] in the matmul dtype (or None). With g = ½ sign(q - p): dTV/dz = q (g - Σ_v q g)."""
    z = (x @ w.T).float()  # [c, Vd] student logits
    log_p = t_logits[rows].float() - t_lse[rows, None]  # [c, Vd] teacher log-probabilities
    p = torch.exp(log_p)  # [c, Vd]
    lse = torch.logsumexp(z, dim=-1)  # [c]
    q = torch.exp(z - lse[:, None])  # [c, Vd] student probabilities
    ce = lse - (p * z).sum(-1)  # [c]
    tv = 0.5 * (q - p).abs().sum(-1)  # [c]: 1 - α
    if eta is None:
        value = tv
    else:
        lam = torch.exp(-eta * (1.0 - tv))  # [c]: λ = exp(-η α), a constant for the gradient (sg)
        value = lam * (ce + (p * log_p).sum(-1)) + (1.0 - lam) * tv  # [c]: λ KL + (1 - λ) TV
    dz = None
    if with_grad:
        g = 0.5 * torch.sign(q - p)  # [c, Vd]: dTV/dq
        dz = q * (g - (q * g).sum(-1, keepdim=True))  # [c, Vd]: dTV/dz
        if eta is not None:
            dz = lam[:, None] * (q - p) + (1.0 - lam[:, None]) * dz  # dKL/dz = q - p
    if keep is not None:
        value, ce = torch.where(keep, value, 0.0), torch.where(keep, ce, 0.0)
        dz = torch.where(keep[:, None], dz, 0.0) if with_grad else None
    return value, ce, z.argmax(-1), dz.to(x.dtype) if with_grad else None


@functools.cache
def _compiled(kernel: Callable) -> Callable:
    # row counts vary (the last chunk of a step, the teacher table of each batch): symbolic shapes
    return torch.compile(kernel, dynamic=True)


def _compiled_chunk_ce() -> Callable:
    return _compiled(_chunk_ce)


def _chunk_kernel(device: torch.device, kernel: Callable = _chunk_ce) -> Callable:
    """The chunk kernel that `device` runs: compiled on CUDA (a few fused kernels), eager elsewhere."""
    return _compiled(kernel) if device.type == "cuda" else kernel


def _soft_ce_forward(
    x: torch.Tensor,
    weight: torch.Tensor,
    t_logits: torch.Tensor,
    t_lse: torch.Tensor,
    rows: torch.Tensor,
    keep: torch.Tensor | None,
    chunk: int,
    with_grad: bool,
    want_dw: bool,
    dtype: torch.dtype,
    objective: str = "ce",
    eta: float = LK_ETA,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """SoftCE's forward pass, `chunk` rows at a time, its matmuls in `dtype` -> (Σ ce fp32 [],
    Σ objective fp32 [] (zero for "ce", whose objective is Σ ce), student argmax [n], dx [n, H]
    (empty without `with_grad`), dW [Vd, H] in the weight's dtype (empty without `want_dw`)), the
    gradients those of the objective: the soft CE, or `objective` "tv" or "lk" (η = `eta`).

    The chunks run in one dispatch context whoever calls (SoftCE eagerly, or the compiled static
    step's op, whose first run leaves other dispatch keys on than its later ones, and which runs
    with autocast off): below autograd and ADInplaceOrView, autocast off. So the compiled chunk
    kernel's guards (the inputs' dispatch keys, the autocast state) see one context, and it
    compiles once; `dtype` comes from the caller, where autocast is known."""
    step = _chunk_kernel(x.device) if objective == "ce" else _chunk_kernel(x.device, _chunk_acceptance)
    n = x.shape[0]
    total = x.new_zeros((), dtype=torch.float32)
    obj_total = x.new_zeros((), dtype=torch.float32)
    pred = torch.empty(n, dtype=torch.long, device=x.device)
    dx = torch.zeros_like(x) if with_grad else x.new_empty(0)  # [n, H]
    dw = torch.zeros(weight.shape, dtype=torch.float32, device=x.device) if want_dw else None  # [Vd, H]
    with torch._C._AutoDispatchBelowADInplaceOrView(), torch.autocast(x.device.type, enabled=False):
        w = weight.to(dtype)
        for a in range(0, n, chunk):
            xc = x[a : a + chunk].to(dtype)  # [c, H]
            kc = keep[a : a + chunk] if keep is not None else None  # [c]
            if objective == "ce":
                ce, top, dz = step(xc, w, t_logits, t_lse, rows[a : a + chunk], with_grad, kc)
            else:
                value, ce, top, dz = step(
                    xc, w, t_logits, t_lse, rows[a : a + chunk], with_grad, kc, eta if objective == "lk" else None
                )
                obj_total += value.sum()
            total += ce.sum()
            pred[a : a + chunk] = top
            if with_grad:
                dx[a : a + chunk] = dz @ w  # [c, H]
                if want_dw:
                    dw += dz.T @ xc  # [Vd, H]
    return total, obj_total, pred, dx, dw.to(weight.dtype) if want_dw else weight.new_empty(0)


# `_soft_ce_forward` as one opaque op, for a region that torch.compile traces (the static step).
# Traced into the region instead, inductor made every chunk's teacher probabilities up front, and
# AOTAutograd saved every chunk's dz [c, Vd] of every step for backward, to make dx there (CPU,
# torch 2.13): the chunking undone. As an op, its chunks run one at a time as in the compacted
# step (the chunk kernel compiled on CUDA) and backward keeps dx and dW only.
_soft_ce_op = torch.library.custom_op("draftsmith::soft_ce", _soft_ce_forward, mutates_args=())


@_soft_ce_op.register_fake
def _(x, weight, t_logits, t_lse, rows, keep, chunk, with_grad, want_dw, dtype, objective="ce", eta=LK_ETA):
    return (
        x.new_empty((), dtype=torch.float32),
        x.new_empty((), dtype=torch.float32),
        x.new_empty(x.shape[0], dtype=torch.long),
        x.new_empty(x.shape if with_grad else (0,)),
        weight.new_empty(weight.shape if want_dw else (0,)),
    )


class SoftCE(torch.autograd.Function):
    """Σ soft-CE of the student rows x [n, H] (normed drafter outputs) through the lm_head
    `weight` [Vd, H], against the teacher rows `rows` [n] of (t_logits [m, Vd], t_lse [m]),
    `chunk` rows at a time -> (Σ ce fp32, Σ objective fp32, student argmax [n]). The objective
    differentiated is the soft CE (`objective` "ce"; Σ objective is then zero), or "tv" or "lk"
    (η = `eta`; Σ ce is then only counted, not differentiated).

    Matmuls run in the autocast dtype when autocast is on (as `lm_head` would under autocast:
    bf16 products, then fp32 logits; dW summed over chunks in fp32), in the weight's dtype
    otherwise. With `with_grad`, forward also makes dx and dW; backward scales them by the
    incoming gradient (the output is a sum). `keep` [n] bool (or None: all): the rows summed.
    Inside a region that torch.compile traces, the forward pass is one opaque op (`_soft_ce_op`)."""

    @staticmethod
    def forward(
        ctx,
        x: torch.Tensor,
        weight: torch.Tensor,
        t_logits: torch.Tensor,
        t_lse: torch.Tensor,
        rows: torch.Tensor,
        keep: torch.Tensor | None,
        chunk: int,
        with_grad: bool,
        objective: str = "ce",
        eta: float = LK_ETA,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        want_dw = with_grad and ctx.needs_input_grad[1]  # not for a frozen lm_head
        run = _soft_ce_op if torch.compiler.is_compiling() else _soft_ce_forward
        dtype = matmul_dtype(x.device, weight.dtype)  # here, where autocast is on if the step runs under it
        total, obj_total, pred, dx, dw = run(
            x, weight, t_logits, t_lse, rows, keep, chunk, with_grad, want_dw, dtype, objective, eta
        )
        if with_grad:
            ctx.save_for_backward(dx, dw if want_dw else None)
        ctx.ce = objective == "ce"
        ctx.mark_non_differentiable(obj_total if ctx.ce else total, pred)
        return total, obj_total, pred

    @staticmethod
    def backward(ctx, grad_ce: torch.Tensor, grad_obj: torch.Tensor, _pred_grad: torch.Tensor) -> tuple:
        dx, dw = ctx.saved_tensors
        grad = grad_ce if ctx.ce else grad_obj
        return grad * dx, (grad * dw if dw is not None else None), *[None] * 8


def soft_ce(
    x: torch.Tensor,
    weight: torch.Tensor,
    teacher: Teacher,
    rows: torch.Tensor,
    chunk: int,
    keep: torch.Tensor | None = None,
    objective: str = "ce",
    eta: float = LK_ETA,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Chunked soft CE of student rows x [n, H] against teacher rows `rows` [n] -> (Σ ce over the
    rows `keep` [n] sets, or all; Σ `objective` over them (zero for "ce"); student argmax [n]).
    An empty step still goes through `SoftCE` (zero gradients): DDP needs every parameter used."""
    return SoftCE.apply(
        x, weight, teacher.logits, teacher.lse, rows, keep, chunk, torch.is_grad_enabled(), objective, eta
    )


def noisy(aux: torch.Tensor, n_aux: int, scale: float) -> torch.Tensor:
    """aux [B, T, n_aux*H] plus Gaussian noise of `scale` times each aux layer's RMS at each token
    (the layers' residual streams differ in scale by orders of magnitude, so one absolute
    noise level would drown some and not touch others)."""
    parts = aux.unflatten(-1, (n_aux, -1))  # [B, T, n_aux, H]
    rms = parts.float().pow(2).mean(-1, keepdim=True).sqrt().to(aux.dtype)  # [B, T, n_aux, 1]
    return (parts + scale * rms * torch.randn_like(parts)).flatten(-2)  # [B, T, n_aux*H]


class DraftObjective(nn.Module):
    """What every method's objective (train/objectives.py) shares: the drafter; the teacher, the
    target's output path (`head`, [V] outputs; `draft_head`, its draft rows) as frozen plain
    attributes, not parameters or buffers (never synced, never saved), at --teacher-temperature in
    training; the positions trained on under --loss-tokens all; the validation walk's counts."""

    def __init__(
        self,
        drafter: nn.Module,
        head: OutputHead,
        chunk: int,
        step_decay: float,
        all_tokens: bool,
        teacher_temperature: float,
    ) -> None:
        super().__init__()
        self.drafter, self.chunk, self.step_decay = drafter, chunk, step_decay
        self.all_tokens, self.teacher_temperature = all_tokens, teacher_temperature
        draft_ids = torch.arange(drafter.d2t.numel(), device=drafter.d2t.device) + drafter.d2t  # [Vd] target ids
        self.head = head
        self.draft_head = head.rows(draft_ids.to(head.weight.device))  # [Vd] outputs

    def temperature(self) -> float:
        """The teacher's temperature: --teacher-temperature in training; 1 in validation, so that
        val loss compares across runs."""
        return self.teacher_temperature if self.training else 1.0

    def trained(self, loss_mask: torch.Tensor, doc: torch.Tensor) -> torch.Tensor:
        """The positions trained on [B, T]: the loss mask, or in training with `all_tokens`
        (train --loss-tokens all) every token of every sample, the prompt's too."""
        return (doc >= 0).to(loss_mask.dtype) if self.training and self.all_tokens else loss_mask

    def walk(
        self, stats: dict[str, torch.Tensor], runs: torch.Tensor, answer: Callable[[], torch.Tensor], depth: int
    ) -> None:
        """stats' walk_cycles and walk_reach: in validation, the walk of the answers (`answer()`
        [B, T]: the positions that draft an answer token) from each position's accepted run (runs
        [B, T]); zeros in training."""
        if self.training:
            stats["walk_cycles"], stats["walk_reach"] = (
                torch.zeros_like(stats["n_valid"]),
                torch.zeros_like(stats["n_valid"]),
            )
        else:
            cycles, reach = walk_counts(runs, answer(), depth)
            stats["walk_cycles"], stats["walk_reach"] = cycles.to(stats["n_valid"]), reach.to(stats["n_valid"])


class TTTObjective(DraftObjective):
    """Wraps the drafter so that one `forward` is one whole TTT step (what DDP / FSDP wrap).

    Two formulations of the same loss and counts (`static`):
      - compacted (default): the teacher and the student's vocab-sized part only at the positions
        that count (`final[used]`, `out[v]`). Least GPU work, but boolean indexing waits for the
        GPU to know each count: several host syncs per step, and shapes that change every batch.
      - static: every position of the row, the valid ones selected by `keep` masks instead of
        compacted, so the step has fixed shapes for a fixed row length (the trainer pads rows to
        --batch-tokens) and no host sync. On CUDA the student's part (all but the teacher's few
        matmuls) is compiled (`torch.compile`, flex attention traced inside it), its elementwise
        work fused into a few kernels; on CPU it runs eagerly. It costs the matmuls of the
        positions left out (padding, untrained tokens).
    """

    def __init__(
        self,
        drafter: nn.Module,
        head: OutputHead,
        ttt: int,
        backend: str,
        chunk: int = 4096,
        step_decay: float = STEP_DECAY,
        aux_noise: float = 0.0,
        static: bool = False,
        all_tokens: bool = False,
        reached_only: bool = False,
        teacher_temperature: float = 1.0,
        loss: str = "ce",
        lk_eta: float = LK_ETA,
    ) -> None:
        super().__init__(drafter, head, chunk, step_decay, all_tokens, teacher_temperature)
        if loss not in LOSSES:
            raise ValueError(f"loss {loss!r}: one of {', '.join(LOSSES)}")
        self.ttt, self.backend, self.aux_noise, self.static = ttt, backend, aux_noise, static
        self.reached_only, self.loss, self.lk_eta = reached_only, loss, lk_eta
        # The default mode: it fuses the elementwise kernels whose launches the host-bound step
        # spends its time on. Not "reduce-overhead" (CUDA graphs) yet: the graph's outputs (loss,
        # counts, and the dx/dW that SoftCE saves for backward) live in its private pool and are
        # overwritten by the next replay, which gradient accumulation and validation interleave
        # with; the teacher table (2 GB at 32k-token rows), an input made outside the graph, would
        # be copied into its static buffers at every replay; and the no-grad validation step is a
        # second graph with a pool of its own. Not "max-autotune-no-cudagraphs": it autotunes the matmuls (cuBLAS-sized bf16 GEMMs)
        # for minutes of compile time and fuses nothing more. dynamic=False: one row length.
        self.compiled_student = torch.compile(self.static_student, dynamic=False) if static else None

    def forward(
        self,
        ids: torch.Tensor,
        loss_mask: torch.Tensor,
        doc: torch.Tensor,
        pos: torch.Tensor,
        aux: torch.Tensor,
        final: torch.Tensor,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """ids, loss_mask, doc, pos [B, T]; aux [B, T, n_aux*H_t]; final [B, T, H_t].
        Returns the weighted loss and per-step counts {key: [K] float}. In training with
        `all_tokens` (train --loss-tokens all), every token of every sample is trained on, the
        prompt's too; validation keeps the loss mask."""
        # Everything that differs between training and validation happens here, outside the step:
        # the compiled static step then reads no `training` flag, and validation (with gradients on,
        # as `Trainer.validate` runs it) replays the training graph instead of compiling its own.
        loss_mask = self.trained(loss_mask, doc)  # [B, T]
        aux = aux.to(self.drafter.fc.weight.dtype)
        if self.training and self.aux_noise > 0:
            aux = noisy(aux, len(self.drafter.config.aux_layer_ids), self.aux_noise)
        step = self.static_step if self.static else self.compacted_step
        loss, stats = step(ids, loss_mask, doc, pos, aux, final)
        runs = stats.pop("runs")  # [B, T]: drafts accepted from each position (the walk reads them in validation)
        # position t drafts answer token t+2
        self.walk(stats, runs, lambda: valid_steps(doc, loss_mask, torch.ones_like(loss_mask), 1)[0], self.ttt)
        return loss, stats

    def compacted_step(
        self,
        ids: torch.Tensor,
        loss_mask: torch.Tensor,
        doc: torch.Tensor,
        pos: torch.Tensor,
        aux: torch.Tensor,
        final: torch.Tensor,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        d = self.drafter
        needed = shift_left(loss_mask, 1).bool() & (doc >= 0)  # the next token is trained on
        ok = teacher_in_draft_vocab(final, self.head, d.t2d, needed, self.chunk)  # [B, T]
        valid = valid_steps(doc, loss_mask, ok, self.ttt)  # [K, B, T]
        # step k at t reads final[t+1+k] (valid[k] is False at the last 1+k positions: nothing wraps)
        used = torch.stack([torch.roll(valid[k], 1 + k, dims=1) for k in range(self.ttt)]).any(0)  # [B, T]
        slot = used.flatten().cumsum(0).view(used.shape) - 1  # [B, T]: row of final[b, s] in the table
        teacher = teacher_table(final[used], self.draft_head, self.chunk, self.temperature())  # [m, Vd]

        def score(
            k: int, out: torch.Tensor, v: torch.Tensor, keep: torch.Tensor | None
        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            rows = torch.roll(slot, -(1 + k), dims=1)[v]  # [n]: the table rows of final[t+1+k]
            ce_sum, obj_sum, pred = soft_ce(
                d.norm(out[v]),
                d.lm_head.weight,
                teacher,
                rows,
                self.chunk,
                keep=keep[v] if keep is not None else None,
                objective=self.loss,
                eta=self.lk_eta,
            )
            hit = torch.zeros_like(v)  # [B, T]
            hit[v] = pred == teacher.top[rows]
            return ce_sum, obj_sum, hit

        return self.unrolled(ids, doc, pos, aux, valid, score)

    def static_step(
        self,
        ids: torch.Tensor,
        loss_mask: torch.Tensor,
        doc: torch.Tensor,
        pos: torch.Tensor,
        aux: torch.Tensor,
        final: torch.Tensor,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The teacher at every position (eager: a few matmuls per chunk, no gradient), then the
        student's part (`static_student`: the unroll and the loss), compiled on CUDA. The teacher
        table goes into the compiled region as an input, so the region never copies it."""
        b, t = ids.shape
        needed = shift_left(loss_mask, 1).bool() & (doc >= 0)  # the next token is trained on
        states = final.flatten(0, 1)  # [B*T, H_t]
        ok = argmax_in_draft_vocab(states, self.head, self.drafter.t2d, self.chunk).view(b, t) & needed  # [B, T]
        teacher = teacher_table(states, self.draft_head, self.chunk, self.temperature())  # [B*T, Vd]: every position's
        student = self.compiled_student if self.compiled_on(final.device) else self.static_student
        return student(ids, loss_mask, doc, pos, aux, ok, teacher)

    @property
    def attention(self) -> str:
        """TTT's attention backend (`Objective.attention`)."""
        return self.backend

    @property
    def static_shapes(self) -> bool:
        """Compiled flex attention and the static step take rows of one length (`Objective`)."""
        return self.backend == "flex" or self.static

    def compiled_on(self, device: torch.device) -> bool:
        """Whether the static step runs its compiled region on `device` (CUDA) rather than eagerly."""
        return self.compiled_student is not None and device.type == "cuda"

    def static_student(
        self,
        ids: torch.Tensor,
        loss_mask: torch.Tensor,
        doc: torch.Tensor,
        pos: torch.Tensor,
        aux: torch.Tensor,
        ok: torch.Tensor,
        teacher: Teacher,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """ok [B, T]: the teacher's argmax at t is a draft token and t+1 is trained on; teacher:
        the table of every position (row b*T + t)."""
        d = self.drafter
        b, t = ids.shape
        valid = valid_steps(doc, loss_mask, ok, self.ttt)  # [K, B, T]
        flat = torch.arange(b * t, device=ids.device)  # [B*T]

        def score(
            k: int, out: torch.Tensor, v: torch.Tensor, keep: torch.Tensor | None
        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            # the table row of final[t+1+k]; where v is False (the last 1+k positions among them), any row
            rows = (flat + 1 + k).clamp(max=b * t - 1)  # [B*T]
            ce_sum, obj_sum, pred = soft_ce(
                d.norm(out).flatten(0, 1),
                d.lm_head.weight,
                teacher,
                rows,
                self.chunk,
                keep=(keep if keep is not None else v).flatten(),
                objective=self.loss,
                eta=self.lk_eta,
            )  # pred [B*T]
            return ce_sum, obj_sum, v & (pred == teacher.top[rows]).view(b, t)  # hit [B, T]

        return self.unrolled(ids, doc, pos, aux, valid, score)

    def unrolled(
        self,
        ids: torch.Tensor,
        doc: torch.Tensor,
        pos: torch.Tensor,
        aux: torch.Tensor,
        valid: torch.Tensor,
        score: Callable[
            [int, torch.Tensor, torch.Tensor, torch.Tensor | None], tuple[torch.Tensor, torch.Tensor, torch.Tensor]
        ],
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The unroll, the weighted loss and the counts, given aux in the drafter's dtype, valid
        [K, B, T] and `score`(k, out_k [B, T, H], valid[k], keep [B, T] ⊆ valid[k] or None: all
        of it) -> (Σ ce over keep, Σ the --loss objective over keep (zero for ce), hit [B, T]:
        valid and the argmaxes agree)."""
        d = self.drafter
        hidden0 = d.project(aux)  # [B, T, H]
        chain = torch.ones_like(valid[0])  # [B, T]: steps so far all valid and correct
        runs = torch.zeros(valid.shape[1:], dtype=torch.long, device=valid.device)  # [B, T]: the leading correct steps
        loss = hidden0.new_zeros((), dtype=torch.float32)
        stats = {key: [] for key in STEP_KEYS}
        weights = step_weights(self.ttt, self.step_decay)
        for k, out in unroll(d, hidden0, ids, pos, doc, self.ttt, self.backend):
            v = valid[k]
            reached = chain & v  # [B, T]: the positions a greedy chain reaches at step k
            keep = reached if self.reached_only else None  # the positions trained on; None: all of v
            ce_sum, obj_sum, hit = score(k, out, v, keep)
            n_valid, n_chain = v.sum(), reached.sum()
            trained = ce_sum if self.loss == "ce" else obj_sum
            loss = loss + weights[k] * trained / (n_chain if self.reached_only else n_valid).clamp(min=1)
            stats["ce_sum"].append(ce_sum.detach())
            stats["obj_sum"].append(obj_sum.detach())
            stats["n_valid"].append(n_valid)
            stats["n_correct"].append(hit.sum())
            stats["n_chain"].append(n_chain)
            stats["n_chain_correct"].append((chain & hit).sum())
            chain = chain & hit
            runs = runs + chain
        out = {key: torch.stack(vals).float() for key, vals in stats.items()}
        out["runs"] = runs
        return loss, out
