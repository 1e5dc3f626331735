"""Draft proposals: the EAGLE-3 drafter with its own KV cache (chain or EAGLE-2 tree), and an
oracle behind the same interface.

A proposer follows the accepted sequence through `observe(aux, next_tokens)`: the target's aux
hidden states of the newly accepted positions (from the verification pass, as at serving time)
and the token after each of them. `propose()` returns a `Draft`: nodes with target token ids,
depths, for trees the parent rows and the ancestor mask (row 0 is the root = the last accepted
token, node i is row i+1), and, in chain sampling mode, the distribution each token was drawn
from. Every field is a device tensor of a fixed shape.

Drafter KV layout: slot s < max_len holds the step-0 entry at position s (target hidden state
at s, token s+1); slots max_len.. hold the current draft's own entries. A draft node at depth d
sits at position n-1+d and sees the step-0 slots < n, its ancestors' slots and its own slot.

Greedy chains and trees are fused: `observe` only stages the new rows (padded to `path_len`)
and `propose` runs step 0 over them and the draft steps as one function of fixed-shape device
tensors (`_cycle`), captured as one CUDA graph on GPU (eager on CPU, same code): no host sync
inside the draft. With `compile`, the drafter step inside it is `torch.compile`d (inductor):
fewer, larger kernels in the same graph. Chain sampling observes eagerly and drafts step by
step (each step a CUDA graph), drawing on the device.

EAGLE-2 tree: level 1 is the top-k of the last step-0 output; each later step feeds the k best
frontier nodes (by cumulative log-prob) and keeps their top-k children; finally the
`total_tokens` best nodes of everything drafted are kept (a set closed under parents, in depth
order). Top-k, selection, parent rows and the ancestor mask are all fixed-shape device ops.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from draftsmith.draft.model import Eagle3Drafter
from draftsmith.runtime.engine import Graphed
from draftsmith.runtime.sampling import Sampling


@dataclass
class Draft:
    tokens: torch.Tensor  # [N] target ids
    depths: torch.Tensor  # [N] 1..depth, non-decreasing
    parents: torch.Tensor | None = None  # [N] rows (0 = root); None: a chain
    anc: torch.Tensor | None = None  # [N+1, N+1] bool, row r sees row c iff c is r or an ancestor (trees)
    q: torch.Tensor | None = None  # [N, V]: the distribution node i was sampled from (chain sampling)


def tree_ancestors(parents: torch.Tensor, depth: int) -> torch.Tensor:
    """[N+1, N+1] bool from parent rows [N] of a tree at most `depth` deep: row r sees row c iff
    c is r or an ancestor of r (row 0 = root). On the device: depth-1 pointer steps."""
    up = torch.cat([parents[:1] * 0, parents])  # [N+1]: each row's parent row (the root's: itself)
    rows = torch.arange(up.shape[0], device=up.device)  # [N+1]
    anc = rows[:, None] == rows[None, :]  # [N+1, N+1]: self
    anc[:, 0] = True
    cur = rows
    for _ in range(depth - 1):
        cur = up.index_select(0, cur)  # [N+1]: one level up
        anc.scatter_(1, cur[:, None], True)
    return anc


def chain_as_tree(draft: Draft) -> Draft:
    """A chain draft with its tree structure (parents i-1, ancestors: the rows before)."""
    k, dev = draft.tokens.shape[0], draft.tokens.device
    return Draft(draft.tokens, draft.depths, torch.arange(k, device=dev),
                 torch.ones(k + 1, k + 1, dtype=torch.bool, device=dev).tril(), draft.q)


def chain_draft(tokens: torch.Tensor, q: torch.Tensor | None = None) -> Draft:
    return Draft(tokens, torch.arange(1, tokens.shape[0] + 1, device=tokens.device), q=q)


class DrafterProposer:
    """The drafter behind the `Proposer` interface. Trees and greedy chains take the fused cycle;
    `fused=False` keeps greedy chain mode on the step-by-step path that chain sampling uses (the
    reference the fused cycle is tested against). `compile`: the drafter step through
    `torch.compile` (falls back to the eager step, with one stderr line, when compiling fails)."""

    def __init__(self, drafter: Eagle3Drafter, sampling: Sampling, max_len: int, mode: str = "chain",
                 depth: int = 7, top_k: int = 10, total_tokens: int = 60, fused: bool = True,
                 compile: bool = False) -> None:
        cfg = drafter.config
        self.drafter, self.sampling, self.max_len = drafter, sampling, max_len
        self.mode, self.depth, self.top_k, self.total_tokens = mode, depth, top_k, total_tokens
        self.fused = mode == "tree" or (fused and sampling.greedy)
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
        self.compiled = compile
        self.step_fn = torch.compile(self._step_eager, dynamic=False) if compile else self._step_eager
        # fused cycle: the observed rows staged for propose(), padded to path_len (aux, next tokens), and n, m
        self.stage = (torch.zeros(self.path_len, drafter.fc.in_features, device=self.device, dtype=self.dtype),
                      torch.zeros(self.path_len, dtype=torch.long, device=self.device),
                      torch.zeros((), dtype=torch.long, device=self.device), torch.ones((), dtype=torch.long, device=self.device))
        self.cycle: Graphed | None = None

    def graph(self) -> None:
        """Capture CUDA graphs (no-op on CPU): in fused mode the whole cycle (staged observe and
        the draft steps); otherwise the 1-token draft step, the context step after each
        verification staying eager. A drafter step that fails to compile falls back to eager."""
        if self.device.type != "cuda":
            return
        try:
            with torch._dynamo.config.patch(recompile_limit=64):  # one entry per proposer and shape (--k auto makes up to 16)
                self._capture()
        except Exception as e:  # noqa: BLE001 (inductor/triton missing or failing: any error of the compiler)
            if not self.compiled:
                raise
            print(f"eval: torch.compile of the drafter step failed ({type(e).__name__}: {str(e)[:200]}); "
                  "drafting with the eager step in CUDA graphs", file=sys.stderr, flush=True)
            self.compiled, self.step_fn = False, self._step_eager
            self.cycle, self.graphs = None, {}
            self._capture()

    def _capture(self) -> None:
        if self.fused:
            if self.cycle is None:  # warm-up writes garbage drafter K/V: capture before decoding
                self.cycle = Graphed(self._cycle, *self.stage)
            return
        if 1 in self.graphs:
            return
        slots = self.cols[self.max_len : self.max_len + 1]  # [1]
        example = (torch.zeros(1, self.drafter.config.hidden_size, device=self.device, dtype=self.dtype),
                   torch.zeros(1, dtype=torch.long, device=self.device), torch.zeros(1, dtype=torch.long, device=self.device),
                   slots, self.cols[None] == slots)
        self.graphs[1] = Graphed(self.step_fn, *example)

    @property
    def size(self) -> int:
        """Draft nodes per proposal (fixed, so that verification has one shape)."""
        if self.mode == "chain":
            return self.depth
        pool = self.top_k + (self.depth - 1) * self.top_k * self.top_k
        return min(self.total_tokens, pool)

    @property
    def path_len(self) -> int:
        """The most rows one verification accepts (the root included): the rows observed after it."""
        return min(self.depth, self.size) + 1

    def reset(self) -> None:
        self.n = 0

    def _step(self, hidden: torch.Tensor, ids: torch.Tensor, pos: torch.Tensor, slots: torch.Tensor,
              mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """hidden [T, H], ids/pos/slots [T], mask [T, S]. Returns logits [T, Vd], out [T, H]."""
        return self.graphs.get(ids.shape[0], self.step_fn)(hidden, ids, pos, slots, mask)

    @torch.no_grad()
    def _step_eager(self, hidden: torch.Tensor, ids: torch.Tensor, pos: torch.Tensor, slots: torch.Tensor,
                    mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:

        def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            self.k_cache.index_copy_(2, slots, k)
            self.v_cache.index_copy_(2, slots, v)
            return F.scaled_dot_product_attention(q, self.k_cache, self.v_cache, attn_mask=mask[None, None], enable_gqa=True)

        logits, out = self.drafter(hidden[None], ids[None], pos[None], attend)
        return logits[0].float(), out[0]

    def _context_step(self, aux: torch.Tensor, next_tokens: torch.Tensor, n: int | torch.Tensor,
                      eager: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Step 0 over target states aux [T, n_aux*H_t] at positions n..n+T-1 (next_tokens [T]:
        the token after each; n an int or a [] tensor), written at the step-0 slots n..n+T-1.
        `eager`: the uncompiled step (rows of any number, which would make `torch.compile`
        specialise again for each). Returns logits [T, Vd], out [T, H]."""
        pos = n + torch.arange(aux.shape[0], device=self.device)  # [T]
        mask = self.cols[None, :] <= pos[:, None]  # [T, S]: causal over the step-0 slots
        hidden = self.drafter.project(aux.to(self.dtype))  # [T, H]
        return (self._step_eager if eager else self._step)(hidden, next_tokens, pos, pos, mask)

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
        after each. Fused mode only stages the last (up to path_len) rows for propose(), without
        a host sync; a longer prefix (a prompt) runs eagerly first."""
        m = aux.shape[0]
        staged = min(m, self.path_len) if self.fused else 0
        if m > staged:
            logits, out = self._context_step(aux[: m - staged], next_tokens[: m - staged].to(self.device), self.n, eager=True)
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
        if not self.fused:
            return chain_draft(*self._chain_from(self.logits[None], self.hidden[None], self.n))
        out = (self.cycle or self._cycle)(*self.stage)  # a graph's outputs: static buffers, overwritten by the next propose()
        return chain_draft(out) if self.mode == "chain" else Draft(*out)

    @torch.no_grad()
    def _cycle(self, aux: torch.Tensor, next_tokens: torch.Tensor, n: torch.Tensor,
               m: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """The fused cycle, one function of fixed-shape device tensors (one CUDA graph): step 0
        over the staged rows aux [path_len, n_aux*H_t], next_tokens [path_len] at positions n..
        of which the first m [] are valid, then the draft. Returns the chain's target ids [K], or
        the tree's (tokens, depths, parents [N], ancestors [N+1, N+1]). The padding rows write
        step-0 slots n+m..n+path_len-1, which nothing reads before the next observe rewrites
        them (the decode loop keeps n + size + 1 <= max_len)."""
        logits, out = self._context_step(aux, next_tokens, n)  # [path_len, Vd], [path_len, H]
        last = (m - 1).reshape(1)  # [1]: row m-1 by a device index (no host sync)
        logits, hidden = logits.index_select(0, last), out.index_select(0, last)  # [1, Vd], [1, H]
        if self.mode == "chain":
            return self._chain_from(logits, hidden, n + m)[0]
        return self._tree_from(logits[0], hidden[0], n + m)

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

    def _tree_from(self, logits: torch.Tensor, hidden: torch.Tensor,
                   n: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The EAGLE-2 tree from step 0's output at the last observed position (logits [Vd],
        hidden [H]); n [] positions observed. Fixed shapes throughout: a pool of P = k + (depth-1)k²
        candidates, then the N best. Returns tokens, depths, parents [N] and ancestors [N+1, N+1]."""
        width, dev = self.top_k, self.device
        arange = torch.arange(width, device=dev)  # [k]
        scores, d_ids = torch.log_softmax(logits, -1).topk(width)  # [k]
        pool_scores, pool_tokens = [scores], [self.vocab_map.index_select(0, d_ids)]
        pool_parents, pool_depths = [torch.full((width,), -1, device=dev)], [torch.ones(width, dtype=torch.long, device=dev)]
        frontier, f_tokens = arange, pool_tokens[0]  # pool indices, target ids [k]
        f_hidden = hidden.expand(width, -1)  # [k, H]
        f_anc = torch.zeros(width, self.draft_slots, dtype=torch.bool, device=dev)  # [k, draft slots]: expanded ancestors
        context = (self.cols[: self.max_len] < n).expand(width, -1)  # [k, max_len]: the step-0 slots seen
        base = width
        for d in range(1, self.depth):
            own = (d - 1) * width + arange  # [k] draft slots of the frontier
            anc = f_anc.clone()
            anc[arange, own] = True
            mask = torch.cat([context, anc], dim=1)  # [k, S]
            pos = (n - 1 + d).expand(width)  # [k]
            logits, out = self._step(f_hidden, f_tokens, pos, self.max_len + own, mask)  # [k, Vd], [k, H]
            s, t = torch.log_softmax(logits, -1).topk(width, dim=-1)  # [k, k]
            cand = (scores[:, None] + s).flatten()  # [k*k] cumulative log-probs
            pool_scores.append(cand)
            pool_tokens.append(self.vocab_map.index_select(0, t.flatten()))
            pool_parents.append(frontier.repeat_interleave(width))
            pool_depths.append(torch.full((width * width,), d + 1, device=dev))
            scores, best = cand.topk(width)  # [k]: the next frontier
            rows = best // width
            frontier, f_tokens = base + best, pool_tokens[-1].index_select(0, best)
            f_hidden, f_anc = out.index_select(0, rows), anc.index_select(0, rows)
            base += width * width
        all_scores = torch.cat(pool_scores)  # [P], in depth order
        keep = torch.sort(-all_scores, stable=True).indices[: self.size].sort().values  # [N]: parents before children
        row_of = torch.zeros_like(all_scores, dtype=torch.long).index_copy_(
            0, keep, torch.arange(1, keep.shape[0] + 1, device=dev))  # [P]: pool index -> row (kept ones)
        pool_parent = torch.cat(pool_parents).index_select(0, keep)  # [N]: -1 at depth 1
        parents = row_of.index_select(0, pool_parent.clamp(min=0)) * (pool_parent >= 0)  # [N] rows, 0 = root
        return (torch.cat(pool_tokens).index_select(0, keep), torch.cat(pool_depths).index_select(0, keep), parents,
                tree_ancestors(parents, self.depth))


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

    @property
    def path_len(self) -> int:
        return self.depth + 1

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
        return Draft(torch.tensor(tokens), depths, torch.tensor(parents), tree_ancestors(torch.tensor(parents), self.depth))


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
