"""Draft proposals: the EAGLE-3 drafter with its own KV cache (chain or EAGLE-2 tree), and an
oracle behind the same interface.

A proposer follows the accepted sequence through `observe(aux, next_tokens)`: the target's aux
hidden states of the newly accepted positions (from the verification pass, as at serving time)
and the token after each of them. `propose()` returns a `Draft`: nodes with target token ids,
parent links (row 0 is the root = the last accepted token, node i is row i+1), depths, and, in
chain sampling mode, the distribution each token was drawn from.

Drafter KV layout: slot s < max_len holds the step-0 entry at position s (target hidden state
at s, token s+1); slots max_len.. hold the current draft's own entries. A draft node at depth d
sits at position n-1+d and sees the step-0 slots < n, its ancestors' slots and its own slot.

Greedy chain mode is fused: `observe` only stages the new rows (padded to K+1) and `propose`
runs step 0 over them and the K-1 draft steps as one function of fixed-shape device tensors,
captured as one CUDA graph on GPU (eager on CPU, same code). Sampling and tree mode observe
eagerly and draft step by step (each step a CUDA graph).

EAGLE-2 tree: level 1 is the top-k of the last step-0 output; each later step feeds the k best
frontier nodes (by cumulative log-prob) and keeps their top-k children; finally the
`total_tokens` best nodes of everything drafted are kept (a set closed under parents).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from draftsmith.draft.model import Eagle3Drafter
from draftsmith.runtime.engine import Graphed
from draftsmith.runtime.sampling import Sampling


@dataclass
class Draft:
    tokens: torch.Tensor  # [N] target ids
    parents: list[int]  # [N] rows (0 = root)
    depths: torch.Tensor  # [N] 1..depth
    q: torch.Tensor | None = None  # [N, V]: the distribution node i was sampled from


def ancestors(parents: list[int]) -> torch.Tensor:
    """[N+1, N+1] bool: row r sees row c iff c is r or an ancestor of r (row 0 = root)."""
    n = len(parents) + 1
    anc = torch.eye(n, dtype=torch.bool)
    for i, p in enumerate(parents):
        anc[i + 1] |= anc[p]
    return anc


def chain_draft(tokens: torch.Tensor, q: torch.Tensor | None = None) -> Draft:
    depth = tokens.shape[0]
    return Draft(tokens, list(range(depth)), torch.arange(1, depth + 1, device=tokens.device), q)


class DrafterProposer:
    """The drafter behind the `Proposer` interface. `fused=False` keeps greedy chain mode on the
    step-by-step path that sampling uses (the reference the fused cycle is tested against)."""

    def __init__(self, drafter: Eagle3Drafter, sampling: Sampling, max_len: int, mode: str = "chain",
                 depth: int = 7, top_k: int = 10, total_tokens: int = 60, fused: bool = True) -> None:
        cfg = drafter.config
        self.drafter, self.sampling, self.max_len = drafter, sampling, max_len
        self.mode, self.depth, self.top_k, self.total_tokens = mode, depth, top_k, total_tokens
        self.fused = fused and mode == "chain" and sampling.greedy
        p = next(drafter.parameters())
        self.device, self.dtype = p.device, p.dtype
        self.draft_slots = depth if mode == "chain" else (depth - 1) * top_k
        shape = (1, cfg.num_key_value_heads, max_len + self.draft_slots, cfg.head_dim)
        self.k_cache = torch.zeros(shape, device=self.device, dtype=self.dtype)
        self.v_cache = torch.zeros(shape, device=self.device, dtype=self.dtype)
        self.vocab_map = drafter.to_target_ids(torch.arange(cfg.draft_vocab_size, device=self.device))  # [Vd]
        self.vocab_size = cfg.vocab_size
        self.n = 0
        self.cols = torch.arange(shape[2], device=self.device)
        self.graphs: dict[int, Graphed] = {}
        # fused cycle: the observed rows staged for propose(), padded to K+1 (aux, next tokens), and n, m
        self.stage = (torch.zeros(depth + 1, drafter.fc.in_features, device=self.device, dtype=self.dtype),
                      torch.zeros(depth + 1, dtype=torch.long, device=self.device),
                      torch.zeros((), dtype=torch.long, device=self.device), torch.ones((), dtype=torch.long, device=self.device))
        self.cycle: Graphed | None = None

    def graph(self) -> None:
        """Capture CUDA graphs (no-op on CPU): in fused mode the whole cycle (staged observe and
        the K-1 draft steps); otherwise the draft steps (1 token in chain mode, top_k in tree
        mode), the context step after each verification staying eager."""
        if self.device.type != "cuda":
            return
        if self.fused:
            if self.cycle is None:  # warm-up writes garbage drafter K/V: capture before decoding
                self.cycle = Graphed(self._cycle, *self.stage)
            return
        t = 1 if self.mode == "chain" else self.top_k
        if t in self.graphs or self.draft_slots < t:
            return
        slots = self.max_len + torch.arange(t, device=self.device)
        mask = torch.zeros(t, self.cols.shape[0], dtype=torch.bool, device=self.device)
        mask[torch.arange(t, device=self.device), slots] = True
        example = (torch.zeros(t, self.drafter.config.hidden_size, device=self.device, dtype=self.dtype),
                   torch.zeros(t, dtype=torch.long, device=self.device), torch.zeros(t, dtype=torch.long, device=self.device),
                   slots, mask)
        self.graphs[t] = Graphed(self._step_eager, *example)

    @property
    def size(self) -> int:
        """Draft nodes per proposal (fixed, so that verification has one shape)."""
        if self.mode == "chain":
            return self.depth
        pool = self.top_k + (self.depth - 1) * self.top_k * self.top_k
        return min(self.total_tokens, pool)

    def reset(self) -> None:
        self.n = 0

    def _step(self, hidden: torch.Tensor, ids: torch.Tensor, pos: torch.Tensor, slots: torch.Tensor,
              mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """hidden [T, H], ids/pos/slots [T], mask [T, S]. Returns logits [T, Vd], out [T, H]."""
        return self.graphs.get(ids.shape[0], self._step_eager)(hidden, ids, pos, slots, mask)

    @torch.no_grad()
    def _step_eager(self, hidden: torch.Tensor, ids: torch.Tensor, pos: torch.Tensor, slots: torch.Tensor,
                    mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:

        def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            self.k_cache.index_copy_(2, slots, k)
            self.v_cache.index_copy_(2, slots, v)
            return F.scaled_dot_product_attention(q, self.k_cache, self.v_cache, attn_mask=mask[None, None], enable_gqa=True)

        logits, out = self.drafter(hidden[None], ids[None], pos[None], attend)
        return logits[0].float(), out[0]

    def _context_step(self, aux: torch.Tensor, next_tokens: torch.Tensor,
                      n: int | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Step 0 over target states aux [T, n_aux*H_t] at positions n..n+T-1 (next_tokens [T]:
        the token after each; n an int or a [] tensor), written at the step-0 slots n..n+T-1.
        Returns logits [T, Vd], out [T, H]."""
        pos = n + torch.arange(aux.shape[0], device=self.device)  # [T]
        mask = self.cols[None, :] <= pos[:, None]  # [T, S]: causal over the step-0 slots
        hidden = self.drafter.project(aux.to(self.dtype))  # [T, H]
        return self._step(hidden, next_tokens, pos, pos, mask)

    def _draft_step(self, hidden: torch.Tensor, tok: torch.Tensor, n: int | torch.Tensor,
                    i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Chain draft step i: token tok [1] with hidden [1, H] at position n+i and draft slot i,
        seeing the step-0 slots < n and draft slots 0..i. Returns logits [1, Vd], out [1, H]."""
        slot = self.cols[self.max_len + i : self.max_len + i + 1]  # [1]
        mask = (self.cols < n) | ((self.cols >= self.max_len) & (self.cols <= slot))  # [S]
        return self._step(hidden, tok, slot - self.max_len + n, slot, mask[None])

    @torch.no_grad()
    def observe(self, aux: torch.Tensor, next_tokens: torch.Tensor) -> None:
        """aux [m, n_aux*H_t]: target states at positions n..n+m-1; next_tokens [m]: the token
        after each. Fused mode only stages the last (up to K+1) rows for propose(), without a
        host sync; a longer prefix (a prompt) runs eagerly first."""
        m = aux.shape[0]
        staged = min(m, self.depth + 1) if self.fused else 0
        if m > staged:
            logits, out = self._context_step(aux[: m - staged], next_tokens[: m - staged].to(self.device), self.n)
            self.n += m - staged
            self.logits, self.hidden = logits[-1].clone(), out[-1].clone()  # [Vd], [H]: drafts position n+1 (graph outputs get overwritten)
        if staged:
            stage_aux, stage_tokens, stage_n, stage_m = self.stage
            stage_aux[:staged].copy_(aux[m - staged :])
            stage_tokens[:staged].copy_(next_tokens[m - staged :])
            stage_n.fill_(self.n)
            stage_m.fill_(staged)
            self.n += staged

    def propose(self) -> Draft:
        if self.fused:  # the graph's output is a static buffer, overwritten by the next propose()
            return chain_draft((self.cycle or self._cycle)(*self.stage))
        return self._chain() if self.mode == "chain" else self._tree()

    @torch.no_grad()
    def _cycle(self, aux: torch.Tensor, next_tokens: torch.Tensor, n: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        """The fused greedy chain cycle, one function of fixed-shape device tensors (one CUDA
        graph): step 0 over the staged rows aux [K+1, n_aux*H_t], next_tokens [K+1] at positions
        n.. of which the first m [] are valid, then the K-1 draft steps. Returns the K drafted
        target ids [K]. The padding rows write step-0 slots n+m..n+K, which nothing reads before
        the next observe rewrites them (the decode loop keeps n+K+1 <= max_len)."""
        logits, out = self._context_step(aux, next_tokens, n)  # [K+1, Vd], [K+1, H]
        last = (m - 1).reshape(1)  # [1]: row m-1 by a device index (no host sync)
        return self._chain_from(logits.index_select(0, last), out.index_select(0, last), n + m)[0]

    def _chain_from(self, logits: torch.Tensor, hidden: torch.Tensor,
                    n: int | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """K chain drafts from step 0's output at the last observed position (logits [1, Vd],
        hidden [1, H]); n: positions observed. Returns the target ids [K] and, when sampling,
        the distribution each was drawn from [K, V]."""
        tokens, qs = [], []
        for i in range(self.depth):
            if self.sampling.greedy:
                d = logits.argmax(-1)  # [1]
            else:
                q_d = self.sampling.probs(logits[0])  # [Vd]
                d = self.sampling.draws(q_d)[None]  # [1], drawn on the device (no host sync)
                qs.append(torch.zeros(self.vocab_size, device=self.device).index_copy_(0, self.vocab_map, q_d))
            tokens.append(self.vocab_map.index_select(0, d))  # [1] target id
            if i < self.depth - 1:
                logits, hidden = self._draft_step(hidden, tokens[-1], n, i)
        q = torch.stack(qs) if qs else None  # [K, V]
        return torch.cat(tokens), q  # [K]

    @torch.no_grad()
    def _chain(self) -> Draft:
        return chain_draft(*self._chain_from(self.logits[None], self.hidden[None], self.n))

    @torch.no_grad()
    def _tree(self) -> Draft:
        width, dev = self.top_k, self.device
        scores, d_ids = torch.log_softmax(self.logits, -1).topk(width)  # [width]
        pool_scores, pool_tokens = [scores], [self.vocab_map[d_ids]]
        pool_parents, pool_depths = [torch.full((width,), -1, device=dev)], [torch.ones(width, dtype=torch.long, device=dev)]
        frontier, f_tokens = torch.arange(width, device=dev), pool_tokens[0]  # pool indices, target ids
        f_hidden = self.hidden.expand(width, -1)  # [width, H]
        f_anc = torch.zeros(width, self.draft_slots, dtype=torch.bool, device=dev)  # expanded ancestors' slots
        base = width
        for d in range(1, self.depth):
            own = (d - 1) * width + torch.arange(width, device=dev)  # [width] draft slots of the frontier
            anc = f_anc.clone()
            anc[torch.arange(width, device=dev), own] = True
            mask = torch.cat([(self.cols[: self.max_len] < self.n).expand(width, -1), anc], dim=1)  # [width, S]
            pos = torch.full((width,), self.n - 1 + d, device=dev)
            logits, out = self._step(f_hidden, f_tokens, pos, self.max_len + own, mask)
            s, t = torch.log_softmax(logits, -1).topk(width, dim=-1)  # [width, width]
            cand = (scores[:, None] + s).flatten()  # [width*width] cumulative log-probs
            pool_scores.append(cand)
            pool_tokens.append(self.vocab_map[t.flatten()])
            pool_parents.append(frontier.repeat_interleave(width))
            pool_depths.append(torch.full((width * width,), d + 1, device=dev))
            scores, best = cand.topk(width)  # next frontier
            rows = best // width
            frontier, f_tokens, f_hidden, f_anc = base + best, pool_tokens[-1][best], out[rows], anc[rows]
            base += width * width
        all_scores = torch.cat(pool_scores)  # [P], in depth order
        keep = torch.sort(-all_scores, stable=True).indices[: self.size].sort().values  # parents before children
        parents_pool, kept = torch.stack([torch.cat(pool_parents)[keep], keep]).tolist()  # [2, N]: one host transfer
        row_of = {p: i + 1 for i, p in enumerate(kept)}
        parents = [0 if p < 0 else row_of[p] for p in parents_pool]
        return Draft(torch.cat(pool_tokens)[keep], parents, torch.cat(pool_depths)[keep])


class OracleProposer:
    """Proposes the target's own continuation (known in advance): a chain of the next `depth`
    reference tokens, or in tree mode that chain with a wrong sibling before each node, so that
    verification has to search the tree. For tau sanity checks: tau should be about depth+1."""

    def __init__(self, reference: list[int], mode: str = "chain", depth: int = 7, vocab_size: int = 2) -> None:
        self.reference, self.mode, self.depth, self.vocab_size = reference, mode, depth, vocab_size
        self.n = 0

    @property
    def size(self) -> int:
        return self.depth if self.mode == "chain" else 2 * self.depth

    def reset(self) -> None:
        self.n = 0

    def observe(self, aux: torch.Tensor, next_tokens: torch.Tensor) -> None:
        self.n += aux.shape[0]

    def propose(self) -> Draft:
        ahead = [self.reference[i] if i < len(self.reference) else 0 for i in range(self.n + 1, self.n + 1 + self.depth)]
        if self.mode == "chain":
            return chain_draft(torch.tensor(ahead))
        tokens, parents = [], []
        for d, tok in enumerate(ahead):
            parent = 0 if d == 0 else 2 * d  # the previous true node (rows: wrong 2d+1, true 2d+2)
            tokens += [(tok + 1) % self.vocab_size, tok]
            parents += [parent, parent]
        depths = torch.arange(1, self.depth + 1).repeat_interleave(2)
        return Draft(torch.tensor(tokens), parents, depths)


def random_drafter(model: torch.nn.Module, draft_vocab_size: int | None = None, seed: int = 0,
                   stride: int = 1) -> Eagle3Drafter:
    """An untrained drafter for `model` (default aux layers, target embeddings; draft id i is target
    id stride*i, so stride 1 is the identity over the first `draft_vocab_size` ids): tau ~ 1, for
    tests and smoke benchmarks."""
    from draftsmith.draft.model import DrafterConfig
    from draftsmith.layers import default_aux_layers
    from draftsmith.target import decoder_layers, embed_weight, text_config

    tc = text_config(model.config)
    torch.manual_seed(seed)
    cfg = DrafterConfig.from_target(tc, draft_vocab_size=min(draft_vocab_size or tc.vocab_size, tc.vocab_size),
                                    aux_layer_ids=default_aux_layers(len(decoder_layers(model))))
    drafter = Eagle3Drafter(cfg)
    drafter.load_target_embeddings(embed_weight(model))
    target_ids = torch.arange(cfg.draft_vocab_size) * stride  # [Vd]
    drafter.set_vocab(target_ids - torch.arange(cfg.draft_vocab_size),
                      torch.zeros(cfg.vocab_size, dtype=torch.bool).index_fill_(0, target_ids, True))
    return drafter.to(embed_weight(model).device).eval()
