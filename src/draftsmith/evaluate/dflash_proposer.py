"""Draft proposals of a DFlash block drafter (`draft/dflash.py`), behind the `Proposer` interface
of decode.py: a chain of K drafts from one drafter forward per cycle, for `batch` rows.

State per row: the context keys/values of every drafter layer (k_norm(k_proj(ctx)) roped, and
v_proj(ctx), with ctx = hidden_norm(fc(aux))) at slots base + s for the row's observed positions
s < n (base: the row's left padding). The block [bonus, mask x K] sits at positions n..n+K, the
bonus being the token after the last observed position (the target's last verified token, not
yet in its cache); it sees the row's n context slots and the whole block (non-causal), and slot
j drafts the token at position n+j, j = 1..K: greedily (argmax), or sampled from slot j's
distribution, which the Draft carries for verification (`q`). This is what vLLM's DFlash
proposer computes (precomputed context K/V in the draft's cache, one query block of 1 + K tokens).

As for the EAGLE-3 proposer (proposer.py), `observe()` only stages the accepted rows (fixed-shape
buffers, no host sync) and every cycle is one function of fixed-shape device tensors (`_cycle`):
the staged rows' context K/V, then the block forward and its draws. On GPU the cycle is one CUDA
graph (`graph()`; eager on CPU, same code). A sampled block draws from Exp(1) noise [B, K, Vd]
that `propose()` stages before the cycle, so that each replay gets fresh draws.
"""

from __future__ import annotations

import torch

from draftsmith.draft.dflash import DFlashDrafter
from draftsmith.evaluate.proposer import Draft, StagedCycle, chain_draft, say_ungraphed
from draftsmith.runtime.engine import Graphed
from draftsmith.runtime.sampling import Sampling, race


class DFlashProposer(StagedCycle):
    mode = "chain"
    compiled = False

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
        # the block's offsets: the bonus and `depth` mask slots (a block of the drafter's size cut to depth), as
        # many as the rows that one verification accepts (the staged rows)
        self.offsets = torch.arange(self.path_len, device=self.device)  # [t]
        # sampling: the Exp(1) noise of the K draws [B, K, Vd]
        noise = None if sampling.greedy else (batch, depth, cfg.draft_vocab_size)
        self.init_stage(batch, self.path_len, drafter.fc.in_features, self.dtype, noise)

    @property
    def size(self) -> int:
        return self.depth

    @property
    def path_len(self) -> int:
        return self.depth + 1

    @property
    def graphed(self) -> bool:
        """Whether the cycle runs as a captured CUDA graph (`graph`)."""
        return self.cycle is not None

    def graph(self) -> None:
        """Capture the cycle in a CUDA graph (no-op on CPU). A capture that fails leaves the
        cycle eager, with one line on stderr (the report's `drafter_graphed` says so)."""
        if self.device.type != "cuda" or self.cycle is not None:
            return
        try:  # its warm-up writes the staged rows' K/V (before decoding: slots that observe_prompt rewrites)
            self.cycle = Graphed(self._cycle, *self.stage)
        except Exception as e:
            say_ungraphed(e)

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
        """Left-padded prompts aux [B, P, n_aux*H_t], next_tokens [B, P], row b's token j in column
        pad[b]+j. All but the last column are written eagerly (padding columns write slots no row
        sees); the last is staged for propose()."""
        p = aux.shape[1]
        self.stage[2].copy_(pad)  # each row's base slot
        if p > 1:
            cols = torch.arange(p - 1, device=self.device).expand(aux.shape[0], p - 1)  # [B, P-1]
            self._write_context(aux[:, :-1], cols - pad[:, None], cols)
        self.observe(aux[:, -1:], next_tokens[:, -1:], torch.ones_like(pad), start=p - 1 - pad)

    def propose(self) -> Draft:
        return chain_draft(*self.replay())

    @torch.no_grad()
    def _cycle(
        self, aux: torch.Tensor, next_tokens: torch.Tensor, base: torch.Tensor, start: torch.Tensor, m: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One cycle, a function of fixed-shape device tensors (one CUDA graph): the context K/V of
        the staged rows aux [B, path_len, n_aux*H_t] at positions start.. of each row (base [B]: its
        base slot), of which the first m [B] are valid and the last one's next token (next_tokens
        [B, path_len]) is the bonus, then the block after them and its K draws (sampled: from
        `self.noise`). Returns the target ids [B, K] and, sampling, their distributions [B, K, V].
        The rows past m write slots past base+n, which nothing reads before the next cycle
        rewrites them (the decode loop keeps base+n + K + 1 <= max_len)."""
        d, b, t = self.drafter, self.batch, self.path_len
        positions = start[:, None] + self.offsets  # [B, t]
        self._write_context(aux, positions, base[:, None] + positions)
        n = start + m  # [B]: positions observed
        bonus = next_tokens.gather(1, (m - 1)[:, None])[:, 0]  # [B]: by a device index (no host sync)
        ids = d.block_ids(bonus)[:, :t]  # [B, t]
        ctx = (self.cols >= base[:, None]) & (self.cols < (base + n)[:, None])  # [B, S]
        mask = torch.cat([ctx[:, None].expand(b, t, -1), ctx.new_ones(b, t, t)], dim=2)  # [B, t, S+t]
        kv = list(zip(self.k_cache, self.v_cache, strict=True))  # per layer [B, nkv, S, hd]
        logits = d.logits(d(ids, n[:, None] + self.offsets, kv, mask))[:, 1:].float()  # [B, K, Vd]: the mask slots
        if self.noise is None:
            return self.vocab_map[logits.argmax(-1)], None  # [B, K] target ids
        q_d = self.sampling.probs(logits)  # [B, K, Vd]
        q = torch.zeros(b, self.depth, self.vocab_size, device=self.device).index_copy_(2, self.vocab_map, q_d)
        return self.vocab_map[race(q_d, self.noise)], q  # [B, K], [B, K, V]
