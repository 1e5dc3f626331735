"""The TTT objective: unroll the drafter K steps and score every step against the target.

Per step k (see `ttt.py` for the alignment), over the valid positions only:

    teacher  p = softmax(final[t+1+k] @ lm_head[draft ids]ᵀ)       the target, on the draft vocab
    student  q = softmax(lm_head_draft(norm(out_k[t])))
    ce_k     = Σ_t -Σ_v p log q  / n_valid_k                        soft CE (forward KL + const)
    loss     = Σ_k 0.8**k ce_k

Valid = same sample × loss_mask[t+2+k] × t2d[argmax of the target's full-vocab logits at t+1+k].
Vocab-sized tensors exist only for `chunk` tokens at a time: each chunk is recomputed in the
backward pass (activation checkpointing), so peak memory does not grow with T × V.

Counts per step (for metrics): n_valid, n_correct (student argmax == teacher argmax), and the
chained counts for cond_acc: positions whose steps 0..k-1 were all valid and correct.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from draftsmith.train.ttt import shift_left, unroll, valid_steps

STEP_WEIGHT = 0.8
STAT_KEYS = ("ce_sum", "n_valid", "n_correct", "n_chain", "n_chain_correct")


@torch.no_grad()
def teacher_in_draft_vocab(final: torch.Tensor, w_full: torch.Tensor, t2d: torch.Tensor, where: torch.Tensor,
                           chunk: int) -> torch.Tensor:
    """[B, T] bool: the target's argmax (over its full vocab) at each position is a draft token.
    Computed only `where` [B, T] is set (positions followed by a trained token); False elsewhere."""
    rows = final[where]  # [n, H]
    ok = torch.zeros(rows.shape[0], dtype=torch.bool, device=final.device)
    for a in range(0, rows.shape[0], chunk):
        ok[a : a + chunk] = t2d[(rows[a : a + chunk].to(w_full.dtype) @ w_full.T).argmax(-1)]
    out = torch.zeros(where.shape, dtype=torch.bool, device=final.device)
    out[where] = ok
    return out


def _chunk_ce(student: torch.Tensor, teacher: torch.Tensor, norm: nn.Module, lm_head: nn.Module,
              w_draft: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """student [c, H] pre-norm drafter outputs, teacher [c, H] target final states.
    Returns (Σ soft-CE, correct [c] bool)."""
    logits = lm_head(norm(student)).float()  # [c, Vd]
    target = (teacher.to(w_draft.dtype) @ w_draft.T).float()  # [c, Vd]
    ce = -(F.softmax(target, dim=-1) * F.log_softmax(logits, dim=-1)).sum(-1)  # [c]
    return ce.sum(), logits.argmax(-1) == target.argmax(-1)


def soft_ce(student: torch.Tensor, teacher: torch.Tensor, norm: nn.Module, lm_head: nn.Module, w_draft: torch.Tensor,
            chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Chunked soft CE over n rows: student/teacher [n, H] -> (Σ ce, correct [n] bool)."""
    total = student.new_zeros((), dtype=torch.float32)
    correct = []
    for a in range(0, max(student.shape[0], 1), chunk):  # an empty step still runs once: DDP needs every param used
        args = (student[a : a + chunk], teacher[a : a + chunk], norm, lm_head, w_draft)
        if torch.is_grad_enabled():
            ce, ok = checkpoint(_chunk_ce, *args, use_reentrant=False)
        else:
            ce, ok = _chunk_ce(*args)
        total = total + ce
        correct.append(ok)
    return total, torch.cat(correct)


class TTTObjective(nn.Module):
    """Wraps the drafter so that one `forward` is one whole TTT step (what DDP / FSDP wrap).

    The teacher's weights (`w_full` [V, H]: the target lm_head; `w_draft` [Vd, H]: its draft
    rows) are frozen plain attributes, not parameters or buffers: never synced, never saved.
    """

    def __init__(self, drafter: nn.Module, w_full: torch.Tensor, K: int, backend: str, chunk: int = 4096) -> None:
        super().__init__()
        self.drafter, self.K, self.backend, self.chunk = drafter, K, backend, chunk
        draft_ids = torch.arange(drafter.d2t.numel(), device=drafter.d2t.device) + drafter.d2t  # [Vd] target ids
        self.w_full = w_full.detach()
        self.w_draft = w_full.detach()[draft_ids.to(w_full.device)].contiguous()  # [Vd, H]

    def forward(self, ids: torch.Tensor, loss_mask: torch.Tensor, doc: torch.Tensor, pos: torch.Tensor,
                aux: torch.Tensor, final: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """ids, loss_mask, doc, pos [B, T]; aux [B, T, n_aux*H_t]; final [B, T, H_t].
        Returns the weighted loss and per-step counts {key: [K] float}."""
        d = self.drafter
        needed = shift_left(loss_mask, 1).bool() & (doc >= 0)  # the next token is trained on
        ok = teacher_in_draft_vocab(final, self.w_full, d.t2d, needed, self.chunk)  # [B, T]
        valid = valid_steps(doc, loss_mask, ok, self.K)  # [K, B, T]
        hidden0 = d.project(aux.to(d.fc.weight.dtype))  # [B, T, H]
        chain = torch.ones_like(valid[0])  # [B, T]: steps so far all valid and correct
        loss = hidden0.new_zeros((), dtype=torch.float32)
        stats = {key: [] for key in STAT_KEYS}
        for k, out in unroll(d, hidden0, ids, pos, doc, self.K, self.backend):
            v = valid[k]
            teacher = torch.roll(final, -(1 + k), dims=1)[v]  # [n, H_t]: final[t+1+k] (wrapped rows are invalid)
            ce_sum, correct = soft_ce(out[v], teacher, d.norm, d.lm_head, self.w_draft, self.chunk)
            n = v.sum()
            loss = loss + STEP_WEIGHT**k * ce_sum / n.clamp(min=1)
            hit = torch.zeros_like(v)
            hit[v] = correct
            stats["ce_sum"].append(ce_sum.detach())
            stats["n_valid"].append(n)
            stats["n_correct"].append(hit.sum())
            stats["n_chain"].append((chain & v).sum())
            stats["n_chain_correct"].append((chain & hit).sum())
            chain = chain & hit
        return loss, {key: torch.stack(vals).float() for key, vals in stats.items()}
