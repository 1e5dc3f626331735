"""Draft proposals of a DFlash block drafter (`draft/dflash.py`), behind the `Proposer` interface
of decode.py: a chain of K drafts from one drafter forward per cycle, for `batch` rows.

State per row: the context keys/values of every drafter layer (k_norm(k_proj(ctx)) roped, and
v_proj(ctx), with ctx = hidden_norm(fc(aux))) at slots base + s for the row's observed positions
s < n (base: the row's left padding), and the bonus token: the token after the last observed
position (the target's last verified token, not yet in its cache). `propose()` runs the block
[bonus, mask x K] at positions n..n+K, which sees the row's n context slots and the whole block
(non-causal), and drafts slot j's token for position n+j, j = 1..K: greedily (argmax), or
sampled from slot j's distribution, which the Draft carries for verification (`q`). This is
what vLLM's DFlash proposer computes (precomputed context K/V in the draft's cache, one query
block of 1 + K tokens). Fixed shapes; no host read.
"""

from __future__ import annotations

import torch

from draftsmith.draft.dflash import DFlashDrafter
from draftsmith.evaluate.proposer import Draft, chain_draft
from draftsmith.runtime.sampling import Sampling, race


class DFlashProposer:
    mode = "chain"
    compiled = False
    graphed = False

    def __init__(self, drafter: DFlashDrafter, sampling: Sampling, max_len: int, depth: int, batch: int = 1) -> None:
        cfg = drafter.config
        if not 1 <= depth <= cfg.drafts:
            raise ValueError(
                f"a DFlash drafter of block size {cfg.block_size} drafts 1..{cfg.drafts} tokens, not {depth}"
            )
        self.drafter, self.sampling, self.max_len, self.depth, self.batch = drafter, sampling, max_len, depth, batch
        p = next(drafter.parameters())
        self.device, self.dtype = p.device, p.dtype
        shape = (cfg.num_layers, batch, cfg.num_key_value_heads, max_len, cfg.head_dim)
        self.k_cache = torch.zeros(shape, device=self.device, dtype=self.dtype)  # [L, B, nkv, S, hd]
        self.v_cache = torch.zeros(shape, device=self.device, dtype=self.dtype)
        self.vocab_map = drafter.to_target_ids(torch.arange(cfg.draft_vocab_size, device=self.device))  # [Vd]
        self.vocab_size = cfg.vocab_size
        self.cols = torch.arange(max_len, device=self.device)  # [S]
        self.n = torch.zeros(batch, dtype=torch.long, device=self.device)  # [B]: positions observed
        self.base = torch.zeros(batch, dtype=torch.long, device=self.device)  # [B]: left padding
        self.bonus = torch.zeros(batch, dtype=torch.long, device=self.device)  # [B]: the token after them
        self.block = depth + 1  # the bonus and `depth` mask slots (a block of the drafter's size cut to depth)

    @property
    def size(self) -> int:
        return self.depth

    @property
    def path_len(self) -> int:
        return self.depth + 1

    def graph(self) -> None:  # no CUDA graphs for this drafter yet
        return None

    def reset(self) -> None:
        self.n.zero_()

    @torch.no_grad()
    def _write_context(self, aux: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor) -> None:
        """aux [B, T, n_aux*H_t] at positions [B, T] -> every layer's context K/V at slots [B, T]."""
        d = self.drafter
        ctx = d.context(aux.to(self.dtype))  # [B, T, H]
        at = slots.clamp(0, self.max_len - 1)[:, None, :, None]  # [B, 1, T, 1]
        for layer, (k, v) in enumerate(d.context_kv(ctx, positions.clamp(min=0))):  # [B, nkv, T, hd]
            index = at.expand_as(k)
            self.k_cache[layer].scatter_(2, index, k)
            self.v_cache[layer].scatter_(2, index, v)

    @torch.no_grad()
    def observe_prompt(self, aux: torch.Tensor, next_tokens: torch.Tensor, pad: torch.Tensor) -> None:
        """Left-padded prompts aux [B, P, ..], next_tokens [B, P], row b's token j in column pad[b]+j."""
        p = aux.shape[1]
        cols = torch.arange(p, device=self.device).expand(aux.shape[0], p)  # [B, P]
        self.base.copy_(pad)
        self._write_context(aux, cols - pad[:, None], cols)
        self.n.copy_(p - pad)
        self.bonus.copy_(next_tokens[:, -1])

    @torch.no_grad()
    def observe(self, aux: torch.Tensor, next_tokens: torch.Tensor, m: torch.Tensor) -> None:
        """The first m[b] rows of aux [B, L, ..] / next_tokens [B, L] are row b's next positions;
        m[b] = 0 parks row b at position 0."""
        live = m > 0
        positions = self.n[:, None] + torch.arange(aux.shape[1], device=self.device)  # [B, L]
        self._write_context(aux, positions, self.base[:, None] + positions)  # rows past m: slots nothing reads yet
        last = (m - 1).clamp(min=0)[:, None]  # [B, 1]
        self.bonus.copy_(torch.where(live, next_tokens.gather(1, last)[:, 0], self.bonus))
        self.n.copy_((self.n + m) * live)

    @torch.no_grad()
    def propose(self) -> Draft:
        d, b, t = self.drafter, self.batch, self.block
        ids = d.block_ids(self.bonus)[:, :t]  # [B, t]
        pos = self.n[:, None] + torch.arange(t, device=self.device)  # [B, t]
        ctx = (self.cols >= self.base[:, None]) & (self.cols < (self.base + self.n)[:, None])  # [B, S]
        mask = torch.cat([ctx[:, None].expand(b, t, -1), ctx.new_ones(b, t, t)], dim=2)  # [B, t, S+t]
        kv = list(zip(self.k_cache, self.v_cache, strict=True))  # per layer [B, nkv, S, hd]
        logits = d.logits(d(ids, pos, kv, mask))[:, 1:].float()  # [B, K, Vd]: the mask slots
        if self.sampling.greedy:
            return chain_draft(self.vocab_map[logits.argmax(-1)])  # [B, K] target ids
        q_d = self.sampling.probs(logits.flatten(0, 1)).view_as(logits)  # [B, K, Vd]
        noise = torch.empty_like(q_d).exponential_(generator=self.sampling.generator(self.device))
        drafts = torch.stack([race(q_d[:, j], noise[:, j]) for j in range(self.depth)], dim=1)  # [B, K]
        q = torch.zeros(b, self.depth, self.vocab_size, device=self.device).index_copy_(2, self.vocab_map, q_d)
        return chain_draft(self.vocab_map[drafts], q)  # q [B, K, V]
