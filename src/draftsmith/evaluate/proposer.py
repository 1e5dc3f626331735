"""Draft proposals: the EAGLE-3 drafter with its own KV cache (chain or EAGLE-2 tree), and an
oracle behind the same interface, for `batch` rows that each decode on their own.

A proposer follows the accepted sequences: `observe_prompt(aux, next_tokens, pad)` takes the
target's aux hidden states of left-padded prompts (row b's first token in column pad[b]) and
the token after each, `observe(aux, next_tokens, m)` the first m[b] rows of each row's newly
accepted positions (from the verification pass, as at serving time; m[b] = 0 parks a finished
row at position 0). `propose()` returns a `Draft` per row: nodes with target token ids and
depths, for trees the parent rows and the ancestor mask (row 0 is the root = the last accepted
token, node i is row i+1), and, in chain sampling mode, the distribution each token was drawn
from. Every field is a device tensor of a fixed shape; nothing here reads the host.

Drafter KV layout, per layer and row: slot base + s < max_len holds the step-0 entry at position s
(target hidden state at s, token s+1; base = the row's padding); slots max_len.. hold the
current draft's own entries. A draft node at depth d sits at position n-1+d and sees the
row's step-0 slots, its ancestors' slots and its own slot.

Every cycle is one function of fixed-shape device tensors (`_cycle`): step 0 over the staged
rows, then the draft steps. On GPU every cycle is one CUDA graph (eager on CPU, same code): no
host sync inside the draft. A sampled chain draws its tokens from Exp(1) noise [B, K, Vd] that
`propose()` stages before the cycle (one kernel outside the graph, from the run's seeded
generator), so the graph holds no random-number generator and each replay gets fresh draws.
With `compile`, the drafter step inside it is `torch.compile`d (inductor): fewer, larger
kernels in the same graph. The whole draft is compiled as one region (a chain's K-1 steps and
the argmax and id lookups between them; a tree's steps, top-k expansion, selection and ancestor
mask), so that inductor also fuses across the steps' boundaries; should that fail, its steps are
compiled one by one, and should that fail too, the step runs eagerly.

Adaptive chain (`stop_below` P): the chain stops drafting once, for every live row, the drafter's
confidence that its whole draft so far is accepted (the product of each draft's probability under
the distribution it came from) falls below P; `depth` is then the longest it drafts. Its cycle is
step 0 and the first draft (one graph), then one graph per further draft step, with one host
read of the rows' confidence after each: a conditional in the host loop, since a graph of
torch 2.11 cannot branch on a device value. The drafts land in fixed buffers [B, depth]; a
proposal is their first L columns.

EAGLE-2 tree: level 1 is the top-k of the last step-0 output; each later step feeds the k best
frontier nodes (by cumulative log-prob) and keeps their top-k children; finally the
`total_tokens` best nodes of everything drafted are kept (a set closed under parents, in depth
order). Top-k, selection, parent rows and the ancestor mask are all fixed-shape device ops.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from draftsmith.draft.methods import method_of
from draftsmith.draft.model import Eagle3Drafter
from draftsmith.draft.peagle import placeholder_inputs
from draftsmith.evaluate.config import tree_pool
from draftsmith.runtime.engine import Graphed
from draftsmith.runtime.linear import prepacked
from draftsmith.runtime.sampling import Sampling, race


@dataclass
class Draft:
    tokens: torch.Tensor  # [B, N] target ids
    depths: torch.Tensor  # [B, N] 1..depth, non-decreasing
    parents: torch.Tensor | None = None  # [B, N] rows (0 = root); None: a chain
    anc: torch.Tensor | None = None  # [B, N+1, N+1] bool, row r sees row c iff c is r or an ancestor (trees)
    q: torch.Tensor | None = None  # [B, N, V]: the distribution node i was sampled from (chain sampling)


@dataclass
class Walk:
    """An adaptive chain's buffers, which its head and its step graphs write in place (so a
    step's graph has no inputs to copy)."""

    tokens: torch.Tensor  # [B, K] target ids of the drafts so far
    q: torch.Tensor | None  # [B, K, V]: the distribution each was drawn from (chain sampling)
    confidence: torch.Tensor  # [B] float32: the product of the drafts' probabilities (0: a parked row)
    go: torch.Tensor  # [K] bool: after draft i, whether some row's confidence still reaches the threshold
    live: torch.Tensor  # [B] bool: rows not parked
    hidden: torch.Tensor  # [B, H]: the last step's output
    masks: torch.Tensor  # [B, K-1, S16]: draft step i's attention row
    pos: torch.Tensor  # [B, K-1, 2]: draft step i's position, twice

    def drafts(self, n: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The first n drafts: target ids [B, n] and, sampling, their distributions [B, n, V]."""
        return self.tokens[:, :n], None if self.q is None else self.q[:, :n]


def tree_ancestors(parents: torch.Tensor, depth: int) -> torch.Tensor:
    """[B, N+1, N+1] bool from parent rows [B, N] of trees at most `depth` deep: row r sees row c
    iff c is r or an ancestor of r (row 0 = root). On the device: depth-1 pointer steps."""
    up = torch.cat([parents[:, :1] * 0, parents], dim=1)  # [B, N+1]: each row's parent row (the root's: itself)
    rows = torch.arange(up.shape[1], device=up.device).expand_as(up)  # [B, N+1]
    anc = (rows[:, :, None] == rows[:, None, :]) | (
        rows[:, None, :] == 0
    )  # [B, N+1, N+1]: self and the root (no setitem: capturable)
    cur = rows
    for _ in range(depth - 1):
        cur = up.gather(1, cur)  # [B, N+1]: one level up
        anc.scatter_(2, cur[..., None], True)
    return anc


def select_nodes(
    scores: torch.Tensor, tokens: torch.Tensor, parents: torch.Tensor, depths: torch.Tensor, size: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """EAGLE-2's selection: of a candidate pool in depth order (scores: cumulative log-probs,
    tokens, parents: pool indices, -1 at depth 1, each [B, P]; depths [P]), the `size` best
    nodes, a set closed under parents (a child never scores above its parent), kept in pool order
    (parents before children). Returns their tokens, depths and parent rows (0 = the root, node i
    = row i+1), each [B, size]."""
    keep = torch.sort(-scores, dim=1, stable=True).indices[:, :size].sort(dim=1).values  # [B, N]
    row_of = torch.zeros_like(scores, dtype=torch.long).scatter_(
        1, keep, torch.arange(1, size + 1, device=scores.device).expand_as(keep)
    )  # [B, P]: pool index -> row (kept ones)
    parent = parents.gather(1, keep)  # [B, N]: pool indices, -1 at depth 1
    rows = row_of.gather(1, parent.clamp(min=0)) * (parent >= 0)  # [B, N] rows, 0 = root
    return tokens.gather(1, keep), depths.expand_as(scores).gather(1, keep), rows


def top_log_probs(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k best of logits [..., V] as log-probs and their indices, each [..., k]: the top-k of
    the logits less their logsumexp (no vocab-sized log-softmax written and read again)."""
    best, ids = logits.topk(k, dim=-1)
    return best - logits.logsumexp(-1, keepdim=True), ids


def chain_as_tree(draft: Draft) -> Draft:
    """Chain drafts with their tree structure (parents i-1, ancestors: the rows before)."""
    b, k = draft.tokens.shape
    dev = draft.tokens.device
    return Draft(
        draft.tokens,
        draft.depths,
        torch.arange(k, device=dev).expand(b, k),
        torch.ones(k + 1, k + 1, dtype=torch.bool, device=dev).tril().expand(b, k + 1, k + 1),
        draft.q,
    )


def failure(e: Exception) -> str:
    """An exception as one short parenthesised phrase, for a fallback's stderr line."""
    return f"({type(e).__name__}: {str(e)[:200]})"


def say_ungraphed(e: Exception) -> None:
    """The stderr line of a drafter whose cycle could not be captured in a CUDA graph (it then drafts eagerly)."""
    print(
        f"eval: CUDA graph capture of the drafter failed {failure(e)}; drafting without graphs (slower: the "
        "speed-up is not the graphed one)",
        file=sys.stderr,
        flush=True,
    )


class StagedCycle:
    """What the proposers whose cycle is one function of fixed-shape device tensors share
    (`DrafterProposer`, `DFlashProposer`): `observe()` stages each newly verified row without a
    host sync, and `replay()` runs the cycle on the staged rows, as the CUDA graph that the
    subclass's `graph()` captured (`self.cycle`) or eagerly (`self._cycle`). A sampled draft
    draws from Exp(1) noise that `replay()` refills before the cycle, so the graph holds no
    random-number generator and each replay gets fresh draws. Subclasses set `device`,
    `sampling` and `_cycle`, and call `init_stage`."""

    device: torch.device
    sampling: Sampling
    _cycle: Callable[..., tuple[torch.Tensor, ...]]

    def init_stage(self, batch: int, rows: int, width: int, dtype: torch.dtype, noise: tuple[int, ...] | None) -> None:
        """Staging for `rows` rows [B, rows] of aux states `width` wide, in `dtype`; `noise`: the
        shape of a sampled draft's Exp(1) noise, None for greedy drafts."""

        def zeros(*size: int, dtype: torch.dtype = torch.long) -> torch.Tensor:
            return torch.zeros(size, dtype=dtype, device=self.device)

        self.n = zeros(batch)  # [B]: positions observed per row
        # the cycle's inputs: staged rows (aux [B, rows, width], next tokens [B, rows]), each row's base slot, the
        # position of its first staged row and its valid rows m [B]
        aux, tokens = zeros(batch, rows, width, dtype=dtype), zeros(batch, rows)
        self.stage = (aux, tokens, zeros(batch), zeros(batch), zeros(batch) + 1)
        self.noise = None if noise is None else zeros(*noise, dtype=torch.float32)  # refilled in place per cycle
        self.cycle: Graphed | None = None

    def reset(self) -> None:
        self.n.zero_()

    @torch.no_grad()
    def observe(
        self, aux: torch.Tensor, next_tokens: torch.Tensor, m: torch.Tensor, start: torch.Tensor | None = None
    ) -> None:
        """aux [B, L, n_aux*H_t] and next_tokens [B, L] (L <= the staged rows), of which the first
        m[b] [B] rows are row b's next positions (`start`: at these positions instead); staged for
        the next cycle, without a host sync. m[b] = 0 parks row b at position 0 (a finished row)."""
        stage_aux, stage_tokens, _, stage_n, stage_m = self.stage
        length = aux.shape[1]
        stage_aux[:, :length].copy_(aux)
        stage_tokens[:, :length].copy_(next_tokens)
        live = m > 0
        stage_n.copy_((self.n if start is None else start) * live)
        stage_m.copy_(m.clamp(min=1))
        self.n.copy_((stage_n + m) * live)

    def replay(self) -> tuple[torch.Tensor, ...]:
        """The cycle on the staged rows; a graph's outputs are static buffers, overwritten by the next replay."""
        if self.noise is not None:  # a sampled draft: fresh noise for its draws
            self.noise.exponential_(generator=self.sampling.generator(self.device))
        return (self.cycle or self._cycle)(*self.stage)


def chain_draft(tokens: torch.Tensor, q: torch.Tensor | None = None) -> Draft:
    return Draft(tokens, torch.arange(1, tokens.shape[1] + 1, device=tokens.device).expand_as(tokens), q=q)


class DrafterProposer(StagedCycle):
    """The EAGLE-3 drafter behind the `Proposer` interface, for `batch` rows. `compile`: the
    drafter step through `torch.compile` (falls back to the eager step, with one stderr line, when
    compiling fails on GPU). A drafter of a method whose one forward drafts the cycle (P-EAGLE's
    module is EAGLE-3's) gets the subclass that drafts so, `ParallelProposer`."""

    def __new__(cls, drafter: Eagle3Drafter, *args: object, **kwargs: object) -> DrafterProposer:
        if cls is DrafterProposer and method_of(drafter).one_forward:
            cls = ParallelProposer
        return super().__new__(cls)

    def __init__(
        self,
        drafter: Eagle3Drafter,
        sampling: Sampling,
        max_len: int,
        mode: str = "chain",
        depth: int = 7,
        top_k: int = 10,
        total_tokens: int = 60,
        compile: bool = False,
        batch: int = 1,
        stop_below: float | None = None,
        lookahead: bool | None = None,
        fused_topk: bool | None = None,
    ) -> None:
        cfg = drafter.config
        # eager on CPU: its linear layers over prepacked weights (runtime/linear.py); inductor lowers nn.Linear itself
        self.drafter = drafter if compile else prepacked(drafter)
        self.sampling, self.max_len, self.batch = sampling, max_len, batch
        self.mode, self.depth, self.top_k, self.total_tokens = mode, depth, top_k, total_tokens
        assert stop_below is None or (mode == "chain" and 0 < stop_below < 1), (mode, stop_below)
        self.stop_below = stop_below
        p = next(drafter.parameters())
        self.device, self.dtype = p.device, p.dtype
        # a tree's top-k as log-probs: two Triton kernels (fused_topk.py) on CUDA (None) or where asked for (True,
        # e.g. Triton's interpreter on CPU), once checked there; torch's elsewhere, or where they fail
        self.top_log_probs = top_log_probs
        assert not fused_topk or mode == "tree", "fused top-k: a tree's draft"
        if mode == "tree" and (fused_topk or (fused_topk is None and self.device.type == "cuda")):
            from draftsmith.evaluate.fused_topk import checked_on  # Triton's import (150-260 ms) only here

            fused = checked_on(self.device, top_k, cfg.draft_vocab_size, top_log_probs)
            assert fused is not None or not fused_topk, "fused_topk=True: the fused top-k does not run here"
            self.top_log_probs = fused or top_log_probs
        self.fused_topk = self.top_log_probs is not top_log_probs  # report.json's tree_topk
        self.draft_slots = depth if mode == "chain" else (depth - 1) * top_k
        # a tree's candidate pool, in depth order: k nodes at depth 1, then k*k at each deeper level
        self.pool_depths = (
            torch.arange(1, depth + 1, device=self.device).repeat_interleave(
                torch.tensor([top_k] + [top_k * top_k] * (depth - 1), device=self.device)
            )
            if mode == "tree"
            else None
        )  # [P]
        shape = (batch, cfg.num_key_value_heads, max_len + self.draft_slots, cfg.head_dim)
        self.k_cache = torch.zeros((cfg.num_layers, *shape), device=self.device, dtype=self.dtype)  # [L, B, nkv, S, hd]
        self.v_cache = torch.zeros((cfg.num_layers, *shape), device=self.device, dtype=self.dtype)
        self.vocab_map = drafter.to_target_ids(torch.arange(cfg.draft_vocab_size, device=self.device))  # [Vd]
        self.vocab_size = cfg.vocab_size
        # A chain's draft step i (0..K-2) writes draft slot i and sees draft slots 0..i. Its mask,
        # position and slot are made once per cycle, not per step (fewer kernels in the graph),
        # each step's slice on a 16-byte boundary: inductor clones a misaligned input of the
        # compiled step. Hence mask rows of S16 columns and offsets stored twice (2 x int64).
        self.cols16 = torch.arange(-(-shape[2] // 16) * 16, device=self.device)  # [S16]: cache slots, then padding
        self.cols = self.cols16[: shape[2]]  # [S]
        steps = torch.arange(max(depth - 1, 0), device=self.device)[:, None].expand(-1, 2)  # [K-1, 2]
        self.chain_steps = steps.contiguous()  # [K-1, 2]: step i's position offset, twice
        self.chain_slots = (max_len + steps).contiguous()  # [K-1, 2]: step i's slot, twice
        self.chain_masks = (self.cols16 >= max_len) & (self.cols16 <= self.chain_slots[:, :1])  # [K-1, S16]
        self.compiled = compile
        self.step_fn = torch.compile(self._step_eager, dynamic=False) if compile else self._step_eager
        self.draft = self._chain_from if mode == "chain" else self._tree_from  # from step 0's output, through `_step`
        # the draft as one compiled region, calling the eager step inside it: a chain's K-1 steps and the argmax
        # and id lookups between them, or a tree's expansions, top-k and selection
        # (an adaptive chain's steps are graphs of their own: its region is each draft's draw and confidence,
        # which would otherwise be ~8 unfused kernels a step, 0.3 ms a K=7 cycle on an H100, 2026-12-05)
        region = functools.partial(self.draft, step=self._step_eager) if stop_below is None else self._walk_draw
        self.draft_region = torch.compile(region, dynamic=False) if compile else None
        if (
            compile
        ):  # dynamo keeps one entry per proposer and step shape, on one code object: --depth auto makes up to 16
            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)

        # a sampled chain's Exp(1) noise for its K draws [B, K, Vd] (the graph reads it where it lies, like the KV cache)
        sampled_chain = mode == "chain" and not sampling.greedy
        noise = (batch, depth, cfg.draft_vocab_size) if sampled_chain else None
        self.init_stage(batch, self.path_len, drafter.fc.in_features, self.dtype, noise)
        self.graphed = self.device.type == "cuda"  # False once a capture has failed (`graph`)
        if stop_below is not None:  # the adaptive chain's buffers, written by its head and steps in place
            zeros, k = functools.partial(torch.zeros, device=self.device), max(depth - 1, 0)
            self.walk = Walk(
                tokens=zeros(batch, depth, dtype=torch.long),
                q=zeros(batch, depth, self.vocab_size) if noise is not None else None,
                confidence=zeros(batch),
                go=zeros(depth, dtype=torch.bool),
                live=zeros(batch, dtype=torch.bool),
                hidden=zeros(batch, cfg.hidden_size, dtype=self.dtype),
                masks=zeros(batch, k, self.cols16.shape[0], dtype=torch.bool),
                pos=zeros(batch, k, 2, dtype=torch.long),
            )
        self.walk_graphs: list[Graphed] = []  # on GPU, the adaptive chain's steps 0..K-2 as graphs (`_capture`)
        # The walk's look-ahead (default on GPU): step i+1 is queued before the host reads whether draft i
        # lets it go on, so the device never idles through that read; a chain that stops has drafted one
        # step for nothing. go[i] comes back through pinned memory, each behind an event of its own.
        self.lookahead = stop_below is not None and (self.device.type == "cuda" if lookahead is None else lookahead)
        on_gpu = self.lookahead and self.device.type == "cuda"
        self.go_host = torch.zeros(depth, dtype=torch.bool, pin_memory=True) if on_gpu else None  # [K]
        self.go_events = [torch.cuda.Event() for _ in range(depth)] if on_gpu else []

    def graph(self) -> None:
        """Capture the cycle in a CUDA graph (no-op on CPU). A capture that fails falls back one
        level at a time, each time with one line on stderr: from the draft compiled as one region
        to its steps compiled one by one, to the eager step in the graph, to drafting without
        graphs (slower, the same tokens; the report's `drafter_compiled` and `drafter_graphed`
        say where it ended)."""
        if self.device.type != "cuda":
            return
        while True:
            try:
                self._capture()
                return
            except Exception as e:
                self.cycle, self.walk_graphs = None, []
                why = failure(e)
                if self.draft_region is not None:
                    print(
                        f"eval: torch.compile of the {self.mode} draft as one region failed {why}; compiling its steps one "
                        "by one",
                        file=sys.stderr,
                        flush=True,
                    )
                    self.draft_region = None
                elif self.compiled:
                    print(
                        f"eval: torch.compile of the drafter step failed {why}; drafting with the eager step in CUDA graphs",
                        file=sys.stderr,
                        flush=True,
                    )
                    self.compiled, self.step_fn = False, self._step_eager
                else:
                    say_ungraphed(e)
                    self.graphed = False
                    return

    def _capture(self) -> None:
        if self.cycle is None:  # warm-up writes garbage drafter K/V: capture before decoding
            self.cycle = Graphed(self._cycle, *self.stage)
            if self.stop_below is not None:  # each further step of the adaptive chain: a graph without inputs
                self.walk_graphs = [Graphed(functools.partial(self._walk_step, i)) for i in range(self.depth - 1)]

    @property
    def size(self) -> int:
        """Draft nodes per proposal (fixed, so that verification has one shape)."""
        if self.mode == "chain":
            return self.depth
        return min(self.total_tokens, tree_pool(self.depth, self.top_k))

    @property
    def path_len(self) -> int:
        """The most rows one verification accepts (the root included): the rows observed after it."""
        return min(self.depth, self.size) + 1

    def _step(
        self, hidden: torch.Tensor, ids: torch.Tensor, pos: torch.Tensor, slots: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """hidden [B, T, H], ids/pos/slots [B, T], mask [B, T, S]. Returns logits [B, T, Vd], out [B, T, H]."""
        return self.step_fn(hidden, ids, pos, slots, mask)

    @torch.no_grad()
    def _step_eager(
        self, hidden: torch.Tensor, ids: torch.Tensor, pos: torch.Tensor, slots: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:

        def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            k_cache, v_cache = self.k_cache[layer], self.v_cache[layer]  # [B, nkv, S, hd]: views
            at = slots[:, None, :, None].expand_as(k)  # [B, nkv, T, hd]: each row's own slots
            k_cache.scatter_(2, at, k)
            v_cache.scatter_(2, at, v)
            return F.scaled_dot_product_attention(q, k_cache, v_cache, attn_mask=mask[:, None], enable_gqa=True)

        attends = [functools.partial(attend, layer) for layer in range(self.k_cache.shape[0])]
        logits, out = self.drafter(hidden, ids, pos, attends)
        return logits.float(), out

    def _context_step(
        self, aux: torch.Tensor, next_tokens: torch.Tensor, base: torch.Tensor, n: torch.Tensor, eager: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Step 0 over target states aux [B, T, n_aux*H_t] at positions n..n+T-1 of each row
        (next_tokens [B, T]: the token after each; base, n [B]), written at slots base+n...
        `eager`: the uncompiled step (rows of any number, which would make `torch.compile`
        specialise again for each). Returns logits [B, T, Vd], out [B, T, H]."""
        pos = n[:, None] + torch.arange(aux.shape[1], device=self.device)  # [B, T]
        slots = base[:, None] + pos  # [B, T]
        cols = self.cols[None, None, :]  # [1, 1, S]
        mask = ((cols >= base[:, None, None]) & (cols <= slots[..., None])) | (
            cols == slots[..., None]
        )  # [B, T, S]: causal, self always
        hidden = self.drafter.project(aux.to(self.dtype))  # [B, T, H]
        return (self._step_eager if eager else self._step)(hidden, next_tokens, pos.clamp(min=0), slots, mask)

    def _context(self, base: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
        """[B, S16]: the step-0 slots that a draft of each row sees (its n observed positions;
        never a draft slot or the padding past S)."""
        return (self.cols16 >= base[:, None]) & (self.cols16 < (base + n)[:, None])

    @torch.no_grad()
    def observe_prompt(self, aux: torch.Tensor, next_tokens: torch.Tensor, pad: torch.Tensor) -> None:
        """Left-padded prompts: aux [B, P, n_aux*H_t] and next_tokens [B, P], row b's token j in
        column pad[b] + j. All but the last column run eagerly (padding columns write slots no
        row sees); the last is staged for propose()."""
        p = aux.shape[1]
        self.stage[2].copy_(pad)  # each row's base slot
        if p > 1:
            self._context_step(aux[:, :-1], next_tokens[:, :-1], pad, -pad, eager=True)
        self.observe(aux[:, -1:], next_tokens[:, -1:], torch.ones_like(pad), start=p - 1 - pad)

    def propose(self) -> Draft:
        out = self.replay()
        if self.stop_below is not None:
            return chain_draft(*self.walk.drafts(self._walk()))
        return chain_draft(*out) if self.mode == "chain" else Draft(*out)

    def _walk(self) -> int:
        """The adaptive chain after its head (which drafted 1): step i runs (drafting i+1) while go[i]
        says a live row is confident. Returns the number of drafts. With the look-ahead, step i is
        queued before go[i-1] is read and dropped when go[i-1] says stop; the drafts kept are the same."""
        step = lambda i: self.walk_graphs[i]() if self.walk_graphs else self._walk_step(i)  # noqa: E731
        drafted = 1
        if not self.lookahead:
            while drafted < self.depth and self._go(drafted - 1):  # one host read a step
                step(drafted - 1)
                drafted += 1
            return drafted
        self._send_go(0)
        while drafted < self.depth:
            step(drafted - 1)  # draft `drafted`, kept only if go[drafted - 1]
            if drafted + 1 < self.depth:
                self._send_go(drafted)
            if not self._go(drafted - 1):
                break
            drafted += 1
        return drafted

    def _send_go(self, i: int) -> None:
        """go[i] on its way to the host (on GPU), once the step that writes it is queued."""
        if self.go_host is not None:
            self.go_host[i].copy_(self.walk.go[i], non_blocking=True)
            self.go_events[i].record()

    def _go(self, i: int) -> bool:
        """Whether drafting goes on after draft i: go[i], read on the host (waiting for it alone)."""
        if self.go_host is not None:
            self.go_events[i].synchronize()
            return bool(self.go_host[i])
        return bool(self.walk.go[i])

    def observe(
        self, aux: torch.Tensor, next_tokens: torch.Tensor, m: torch.Tensor, start: torch.Tensor | None = None
    ) -> None:
        super().observe(aux, next_tokens, m, start)
        if self.stop_below is not None:  # a parked row's confidence keeps no chain going
            self.walk.live.copy_(m > 0)

    @torch.no_grad()
    def _cycle(
        self, aux: torch.Tensor, next_tokens: torch.Tensor, base: torch.Tensor, n: torch.Tensor, m: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        """One cycle, a function of fixed-shape device tensors (one CUDA graph): step 0 over the
        staged rows aux [B, path_len, n_aux*H_t], next_tokens [B, path_len] at positions n.. of
        which the first m [B] are valid, then the draft (a sampled chain's draws from
        `self.noise`). Returns the chain's target ids [B, K]
        (and, sampling, their distributions [B, K, V]), or the tree's (tokens, depths, parents
        [B, N], ancestors [B, N+1, N+1]). The padding rows write step-0 slots past n+m, which
        nothing reads before an observe rewrites them (the decode loop keeps base+n + size + 1
        <= max_len)."""
        logits, out = self._context_step(aux, next_tokens, base, n)  # [B, path_len, Vd], [B, path_len, H]
        last = (m - 1)[:, None, None]  # [B, 1, 1]: each row's last valid row, by a device index (no host sync)
        logits = logits.gather(1, last.expand(-1, 1, logits.shape[-1]))[:, 0]  # [B, Vd]
        hidden = out.gather(1, last.expand(-1, 1, out.shape[-1]))[:, 0]  # [B, H]
        if self.stop_below is not None:  # the adaptive chain's head: its first draft, and the steps' masks
            masks, pos = self._chain_inputs(base, n + m)
            self.walk.masks.copy_(masks)
            self.walk.pos.copy_(pos)
            (self.draft_region or self._walk_draw)(0, logits, hidden)
            return ()
        return (self.draft_region or self.draft)(logits, hidden, base, n + m)

    def _walk_step(self, i: int) -> tuple:
        """Draft step i of the adaptive chain (0..K-2): feeds draft i, draws draft i+1, in the walk's buffers."""
        w = self.walk
        logits, out = self._chain_step(i, w.hidden, w.tokens[:, i], w.pos, w.masks, self._step)
        (self.draft_region or self._walk_draw)(i + 1, logits, out)
        return ()

    def _chain_inputs(self, base: torch.Tensor, n: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Every chain draft step's attention rows [B, K-1, S16] and positions [B, K-1, 2] (step
        i at n+i, twice), for rows whose step-0 slots start at base [B] with n [B] observed."""
        return self._context(base, n)[:, None] | self.chain_masks, n[:, None, None] + self.chain_steps

    def _chain_step(
        self,
        i: int,
        hidden: torch.Tensor,
        token: torch.Tensor,
        pos: torch.Tensor,
        masks: torch.Tensor,
        step: Callable,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Chain draft step i (0..K-2): draft i (target id token [B], after the output hidden
        [B, H]) at its [B, 1] position and slot and [B, 1, S] mask (`_chain_inputs`' pos and
        masks), through `step`. Returns logits [B, Vd] and the output [B, H]."""
        b = token.shape[0]
        logits, out = step(
            hidden[:, None],
            token[:, None],
            pos[:, i, :1],
            self.chain_slots[i, :1].expand(b, 1),
            masks[:, i : i + 1, : self.cols.shape[0]],
        )  # [B, 1, Vd], [B, 1, H]
        return logits[:, 0], out[:, 0]

    def _walk_draw(self, i: int, logits: torch.Tensor, hidden: torch.Tensor) -> None:
        """Draft i of the adaptive chain from its logits [B, Vd] and the step's output [B, H]: as
        `_draw`, into the walk's buffers, and the draft's probability folded into each row's
        confidence (draft 0 starts it; a parked row's is 0)."""
        tokens: list[torch.Tensor] = []
        qs: list[torch.Tensor] = []
        d = self._draw(logits, i, tokens, qs)  # [B] draft-vocab ids
        w = self.walk
        w.tokens[:, i].copy_(tokens[0])
        if qs:
            w.q[:, i].copy_(qs[0])
            p = qs[0].gather(1, tokens[0][:, None])[:, 0]  # [B]: the drawn token's probability under q
        else:
            p = (logits.gather(1, d[:, None])[:, 0] - logits.logsumexp(-1)).exp()  # [B]: the argmax's softmax
        w.confidence.copy_((w.confidence if i else w.live) * p)
        w.go[i].copy_((w.confidence >= self.stop_below).any())
        w.hidden.copy_(hidden)

    def _chain_from(
        self,
        logits: torch.Tensor,
        hidden: torch.Tensor,
        base: torch.Tensor,
        n: torch.Tensor,
        step: Callable | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """K chain drafts from step 0's output at each row's last observed position (logits
        [B, Vd], hidden [B, H]); n [B]: positions observed; sampled, each draw races q against
        `self.noise` [B, K, Vd]. `step`: the drafter step (default `_step`). Returns the target
        ids [B, K] and, when sampling, the distribution each was drawn from [B, K, V]."""
        step = step or self._step
        tokens, qs = [], []
        masks, pos = self._chain_inputs(base, n)  # [B, K-1, S16], [B, K-1, 2]
        for i in range(self.depth):
            self._draw(logits, i, tokens, qs)
            if i < self.depth - 1:
                logits, hidden = self._chain_step(i, hidden, tokens[-1], pos, masks, step)  # [B, Vd], [B, H]
        q = torch.stack(qs, dim=1) if qs else None  # [B, K, V]
        return torch.stack(tokens, dim=1), q  # [B, K]

    def _draw(self, logits: torch.Tensor, i: int, tokens: list[torch.Tensor], qs: list[torch.Tensor]) -> torch.Tensor:
        """Draft i of a chain from its logits [B, Vd]: the argmax, or sampling, a draw racing q
        against `self.noise`; its target ids [B] appended to `tokens` and, sampling, q [B, V] to
        `qs`. Returns its draft-vocab ids [B]."""
        if self.noise is None:
            d = logits.argmax(-1)  # [B]
        else:
            q_d = self.sampling.probs(logits)  # [B, Vd]
            d = race(q_d, self.noise[:, i])  # [B]: a draw from q_d
            qs.append(
                torch.zeros(q_d.shape[0], self.vocab_size, device=self.device).index_copy_(1, self.vocab_map, q_d)
            )
        tokens.append(self.vocab_map.index_select(0, d))  # [B] target ids
        return d

    def _tree_from(
        self,
        logits: torch.Tensor,
        hidden: torch.Tensor,
        base: torch.Tensor,
        n: torch.Tensor,
        step: Callable | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The EAGLE-2 tree from step 0's output at each row's last observed position (logits
        [B, Vd], hidden [B, H]); n [B] positions observed. Fixed shapes throughout: a pool of
        P = k + (depth-1)k² candidates, then the N best. `step`: the drafter step (default
        `_step`). Returns tokens, depths, parents [B, N] and ancestors [B, N+1, N+1]."""
        step = step or self._step
        width, dev, b = self.top_k, self.device, logits.shape[0]
        arange = torch.arange(width, device=dev)  # [k]
        scores, d_ids = self.top_log_probs(logits, width)  # [B, k]
        pool_scores, pool_tokens = [scores], [self.vocab_map[d_ids]]  # [B, k] each
        pool_parents = [torch.full((b, width), -1, device=dev)]
        frontier, f_tokens = arange.expand(b, width), pool_tokens[0]  # pool indices, target ids [B, k]
        f_hidden = hidden[:, None].expand(b, width, hidden.shape[-1])  # [B, k, H]
        f_anc = torch.zeros(
            b, width, self.draft_slots, dtype=torch.bool, device=dev
        )  # [B, k, draft slots]: expanded ancestors
        context = self._context(base, n)[:, None, : self.max_len].expand(b, width, self.max_len)  # [B, k, max_len]
        base_idx = width
        slot_ids = torch.arange(self.draft_slots, device=dev)  # [draft slots]
        for d in range(1, self.depth):
            own = (d - 1) * width + arange  # [k] draft slots of the frontier
            # each frontier node also sees its own slot (a comparison, not an index_put of a host
            # scalar, which CUDA graph capture refuses)
            anc = f_anc | (slot_ids == own[:, None])  # [B, k, draft slots]
            mask = torch.cat([context, anc], dim=2)  # [B, k, S]
            pos = (n - 1 + d)[:, None].expand(b, width)  # [B, k]
            logits, out = step(
                f_hidden, f_tokens, pos, (self.max_len + own).expand(b, width), mask
            )  # [B, k, Vd], [B, k, H]
            s, t = self.top_log_probs(logits, width)  # [B, k, k]
            cand = (scores[..., None] + s).flatten(1)  # [B, k*k] cumulative log-probs
            pool_scores.append(cand)
            pool_tokens.append(self.vocab_map[t.flatten(1)])
            pool_parents.append(frontier.repeat_interleave(width, dim=1))
            scores, best = cand.topk(width)  # [B, k]: the next frontier
            rows = best // width  # [B, k]
            frontier, f_tokens = base_idx + best, pool_tokens[-1].gather(1, best)
            f_hidden = out.gather(1, rows[..., None].expand(b, width, out.shape[-1]))
            f_anc = anc.gather(1, rows[..., None].expand(b, width, self.draft_slots))
            base_idx += width * width
        pool = (torch.cat(x, dim=1) for x in (pool_scores, pool_tokens, pool_parents))  # [B, P] each, in depth order
        tokens, depths, parents = select_nodes(*pool, self.pool_depths, self.size)
        return tokens, depths, parents, tree_ancestors(parents, self.depth)


class ParallelProposer(DrafterProposer):
    """A P-EAGLE drafter (draft/peagle.py): one drafter forward over K-1 placeholder slots after
    step 0, instead of a chain's K-1 steps; chains only.

    Draft 1 comes from step 0's output at each row's last observed position, as in a chain; drafts
    2..K from one step over the K-1 slots, each at a chain's draft slot, position and mask (draft
    step i of a chain: slot max_len+i, position n+i, the context and draft slots 0..i), which is
    vLLM's causal attention over its parallel slots. Fixed shapes, no host sync: the cycle stays
    one CUDA graph."""

    def __init__(
        self, drafter: Eagle3Drafter, sampling: Sampling, max_len: int, mode: str = "chain", *args, **kw
    ) -> None:
        assert mode == "chain", "a parallel drafter drafts chains"
        assert kw.get("stop_below") is None, "one forward drafts the chain: nothing to stop early"
        super().__init__(drafter, sampling, max_len, mode, *args, **kw)

    def _chain_from(
        self,
        logits: torch.Tensor,
        hidden: torch.Tensor,
        base: torch.Tensor,
        n: torch.Tensor,
        step: Callable | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """K drafts from step 0's logits [B, Vd] at each row's last observed position (`hidden`,
        its output, is not read: no slot reads another's output); n [B]: positions observed.
        Returns the target ids [B, K] and, sampling, their distributions [B, K, V]."""
        step = step or self._step
        b, s, k = n.shape[0], self.cols.shape[0], self.depth
        rows = [logits]  # [B, Vd] per draft
        if k > 1:
            ids, slot_hidden = placeholder_inputs(self.drafter, self.chain_slots[:, 0].expand(b, k - 1), self.dtype)
            masks = self._chain_inputs(base, n)[0]  # [B, K-1, S16]: context, slots 0..i
            pos = n[:, None] + self.chain_steps[:, 0]  # [B, K-1]: slot i at position n+i (contiguous, for inductor)
            slots = self.chain_slots[:, 0].expand(b, k - 1)  # [B, K-1]
            par, _ = step(slot_hidden, ids, pos, slots, masks[..., :s])  # [B, K-1, Vd]
            rows += list(par.unbind(1))
        tokens: list[torch.Tensor] = []
        qs: list[torch.Tensor] = []
        for i, row in enumerate(rows):
            self._draw(row, i, tokens, qs)
        q = torch.stack(qs, dim=1) if qs else None  # [B, K, V]
        return torch.stack(tokens, dim=1), q  # [B, K]


class OracleProposer:
    """Proposes the target's own continuation (known in advance; one row): a chain of the next
    `depth` reference tokens, or in tree mode that chain with a wrong sibling before each node,
    so that verification has to search the tree. For tau sanity checks: tau should be about
    depth+1. It reads its counts on the host (a test tool, not timed)."""

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

    def observe_prompt(self, aux: torch.Tensor, next_tokens: torch.Tensor, pad: torch.Tensor) -> None:
        self.n = aux.shape[1] - int(pad[0])

    def observe(self, aux: torch.Tensor, next_tokens: torch.Tensor, m: torch.Tensor) -> None:
        self.n = self.n + int(m[0]) if int(m[0]) else 0

    def propose(self) -> Draft:
        ahead = [
            self.reference[i] if i < len(self.reference) else 0 for i in range(self.n + 1, self.n + 1 + self.depth)
        ]
        if self.mode == "chain":
            return chain_draft(torch.tensor([ahead]))
        tokens, parents = [], []
        for d, tok in enumerate(ahead):
            parent = 0 if d == 0 else 2 * d  # the previous true node (rows: wrong 2d+1, true 2d+2)
            tokens += [(tok + 1) % self.vocab_size, tok]
            parents += [parent, parent]
        depths = torch.arange(1, self.depth + 1).repeat_interleave(2)[None]  # [1, 2*depth]
        return Draft(
            torch.tensor([tokens]), depths, torch.tensor([parents]), tree_ancestors(torch.tensor([parents]), self.depth)
        )
