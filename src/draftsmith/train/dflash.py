"""The DFlash objective (`train --method dflash`): blocks anchored in a packed row, scored against the target.

A block anchored at position a is the token at a (as the bonus) and K = block_size-1 mask slots
at positions pos[a]..pos[a]+K; it sees the target's context at the positions s < a of the same
sample (`draft.dflash.block_mask`) and its own slots, as vLLM's DFlash proposer does after the
target has verified the tokens up to a. Slot j (1..K) drafts token a+j:

    teacher  p = softmax(head(final[a+j-1])[draft ids] / τ_T)    the target, on the draft vocab
    student  z = lm_head(norm(out[a, j]))
    ce_j     = Σ_a (logsumexp(z) - Σ_v p z) / n_valid_j
    loss     = Σ_j step_decay**(j-1) ce_j                   (draft/step_weights.py, as TTT's steps)

Valid (slot j of anchor a) = token a+j in a's sample × loss_mask[a+j] × t2d[argmax target at a+j-1].
An anchor is a position whose slot 1 is valid. In training each row takes a random subset of
its anchors (`train --anchors`, by default about batch_tokens / block_size of them, so the blocks
hold about as many queries as the row has tokens; drawn from torch's generator, which checkpoints
save), or every one of them (`--anchors all`, as DFlash's reference trains: every answer
position, each pass); validation takes every anchor. Either way the blocks go through the
drafter at most batch_tokens / block_size at a time. The counts per slot are TTT's per step (loss.py):
n_valid, n_correct, n_chain (slots 1..j-1 all valid and correct): `acc_k`, `cond_acc_k` and the
simulated τ mean what they mean for EAGLE-3, with step k = slot k+1, and validation walks the
answers (`walk.walk_counts`) from every anchor's accepted run. The vocab-sized part is the
chunked `SoftCE` of loss.py; attention is an explicit boolean mask (SDPA).
"""

from __future__ import annotations

import torch

from draftsmith.draft.dflash import DFlashDrafter, block_mask
from draftsmith.draft.step_weights import STEP_DECAY, step_weights
from draftsmith.runtime.head import OutputHead
from draftsmith.train.loss import STEP_KEYS, DraftObjective, soft_ce, teacher_in_draft_vocab, teacher_table
from draftsmith.train.ttt import shift_left


def slot_valid(doc: torch.Tensor, ok: torch.Tensor, drafts: int) -> torch.Tensor:
    """[K, B, T] bool: slot j+1 of the block anchored at t drafts a trained token in t's sample
    (ok [B, T]: the target's argmax at t is a draft token and t+1 is trained on)."""
    out = []
    for j in range(drafts):
        same = (shift_left(doc, j + 1, fill=-2) == doc) & (doc >= 0)
        out.append(same & shift_left(ok, j).bool())
    return torch.stack(out)  # [K, B, T]


class DFlashObjective(DraftObjective):
    """One `forward` is one training (or validation) step of the DFlash drafter: the trainer's
    `Objective` (train/objectives.py; `ttt` = the drafts per block)."""

    attention = "sdpa"  # an explicit block mask
    static_shapes = False  # rows of any length (no compiled form)
    reached_only = False  # every valid slot is trained on
    loss = "ce"  # the block objective is the soft CE (train --loss ce; config refuses the others)

    def __init__(
        self,
        drafter: DFlashDrafter,
        head: OutputHead,
        chunk: int = 4096,
        step_decay: float = STEP_DECAY,
        anchors: int | None = 512,
        anchor_chunk: int = 512,
        all_tokens: bool = False,
        teacher_temperature: float = 1.0,
    ) -> None:
        super().__init__(drafter, head, chunk, step_decay, all_tokens, teacher_temperature)
        # training anchors per row (None: every anchor), and the most blocks in one forward
        self.ttt, self.anchors, self.anchor_chunk = drafter.config.drafts, anchors, anchor_chunk

    def compiled_on(self, device: torch.device) -> bool:
        return False

    def forward(
        self,
        ids: torch.Tensor,
        loss_mask: torch.Tensor,
        doc: torch.Tensor,
        pos: torch.Tensor,
        aux: torch.Tensor,
        final: torch.Tensor,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """ids, loss_mask, doc, pos [B, T]; aux [B, T, n_aux*H_t]; final [B, T, H_t] -> the
        weighted loss and per-slot counts {key: [K]}."""
        loss_mask = self.trained(loss_mask, doc)  # [B, T]
        d, k_drafts = self.drafter, self.ttt
        needed = shift_left(loss_mask, 1).bool() & (doc >= 0)  # [B, T]: the next token is trained on
        ok = teacher_in_draft_vocab(final, self.head, d.t2d, needed, self.chunk)  # [B, T]
        valid = slot_valid(doc, ok, k_drafts)  # [K, B, T]
        sums = {key: [torch.zeros((), device=ids.device) for _ in range(k_drafts)] for key in STEP_KEYS}
        runs = torch.zeros(ids.shape, dtype=torch.long, device=ids.device)  # [B, T]: accepted run per anchor
        temperature = self.temperature()
        ctx_all = d.context(aux.to(d.fc.weight.dtype))  # [B, T, H]
        for b in range(ids.shape[0]):
            anchors = valid[0, b].nonzero().flatten()  # [n]
            if self.training and self.anchors is not None and anchors.numel() > self.anchors:
                pick = torch.randperm(anchors.numel(), device="cpu")[: self.anchors].sort().values
                anchors = anchors[pick.to(anchors.device)]
            chunks = anchors.split(self.anchor_chunk) if anchors.numel() else [anchors]
            ctx_kv = d.context_kv(ctx_all[b : b + 1], pos[b : b + 1])  # per layer [1, nkv, T, hd]
            for part in chunks:
                self._blocks(b, part, ids, doc, pos, final, valid, ctx_kv, temperature, sums, runs)
        weights = step_weights(k_drafts, self.step_decay)
        n_valid = torch.stack(sums["n_valid"]).float()
        loss = sum(
            w * ce / n.clamp(min=1) for w, ce, n in zip(weights, sums["ce_sum"], n_valid, strict=True)
        )  # [] (a tensor even when no anchor was valid)
        stats = {key: torch.stack([torch.as_tensor(x).float() for x in vals]).detach() for key, vals in sums.items()}
        # the anchor at t drafts answer token t+1
        self.walk(
            stats,
            runs,
            lambda: (shift_left(doc, 1, fill=-2) == doc) & (doc >= 0) & shift_left(loss_mask, 1).bool(),
            k_drafts,
        )
        return loss, stats

    def _blocks(
        self,
        b: int,
        anchors: torch.Tensor,
        ids: torch.Tensor,
        doc: torch.Tensor,
        pos: torch.Tensor,
        final: torch.Tensor,
        valid: torch.Tensor,
        ctx_kv: list[tuple[torch.Tensor, torch.Tensor]],
        temperature: float,
        sums: dict[str, list[torch.Tensor]],
        runs: torch.Tensor,
    ) -> None:
        """The blocks of row b anchored at `anchors` [n]: one forward, the loss and counts per slot
        added to `sums`, each anchor's accepted run written to runs[b]."""
        d, k_drafts, bs = self.drafter, self.ttt, self.ttt + 1
        n, t = anchors.numel(), ids.shape[1]
        block_ids = d.block_ids(ids[b, anchors]).flatten()[None]  # [1, n*bs]
        block_pos = (pos[b, anchors][:, None] + torch.arange(bs, device=ids.device)).flatten()[None]  # [1, n*bs]
        mask = block_mask(anchors, doc[b], bs, t)[None]  # [1, n*bs, T + n*bs]
        out = d(block_ids, block_pos, ctx_kv, mask).view(n, bs, -1)[:, 1:]  # [n, K, H]: the mask slots
        v = valid[:, b, anchors].T  # [n, K]
        target_at = (anchors[:, None] + torch.arange(k_drafts, device=ids.device)).clamp(max=t - 1)  # [n, K]: a+j-1
        teacher = teacher_table(final[b, target_at.flatten()], self.draft_head, self.chunk, temperature)  # [n*K, Vd]
        rows = torch.arange(n * k_drafts, device=ids.device).view(n, k_drafts)  # [n, K]
        chain = torch.ones(n, dtype=torch.bool, device=ids.device)
        run = torch.zeros(n, dtype=torch.long, device=ids.device)
        for j in range(k_drafts):
            vj = v[:, j]  # [n]
            ce, _, pred = soft_ce(d.norm(out[:, j]), d.lm_head.weight, teacher, rows[:, j], self.chunk, keep=vj)
            hit = vj & (pred == teacher.top[rows[:, j]])  # [n]
            reached = chain & vj
            sums["ce_sum"][j] = sums["ce_sum"][j] + ce
            sums["n_valid"][j] = sums["n_valid"][j] + vj.sum()
            sums["n_correct"][j] = sums["n_correct"][j] + hit.sum()
            sums["n_chain"][j] = sums["n_chain"][j] + reached.sum()
            sums["n_chain_correct"][j] = sums["n_chain_correct"][j] + (chain & hit).sum()
            chain = chain & hit
            run = run + chain
        runs[b, anchors] = run
