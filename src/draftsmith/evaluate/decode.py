"""The two decoding loops that `draftsmith eval` compares, over the same engine (the fast
`TargetEngine`, or for targets that fail its self-check the generic `HFEngine`, one row): plain
decoding (one target forward per token) and speculative decoding (draft, verify in one forward
with the draft's tree mask, compact the accepted path's KV, feed the drafter the aux states of
the accepted positions). One loop serves both, for a batch of prompts that each decode on their
own: row b has its own length, accepts its own count, and finishes on its own (a finished row
is parked at position 0 and computes nothing anyone reads until the batch is done).
Verification, chain or tree, greedy or sampled, stays on the device with fixed shapes and one
host read per cycle (a chain: causal mask, no compaction, the accepted path is a prefix; a
tree: the draft's tree mask and a fixed-shape KV compaction). A greedy tree's acceptance,
compaction and accepted aux rows are one CUDA graph on the fast engine (`tree_acceptance`), captured
before the clock starts.

Both time decoding only: the clock starts after the prompts' prefill and stops after the last
row's last token, with the device synchronised; each row is charged an equal share of its
batch's time (batch 1: its own time). Rows stop at a stop token (kept) or after
`max_new_tokens`.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch

from draftsmith.evaluate.proposer import Draft
from draftsmith.runtime.engine import TargetEngine
from draftsmith.runtime.engine_choice import Engine
from draftsmith.runtime.sampling import Sampling, read_verified, tree_accept, verify_chain_greedy, verify_chain_sampled


class Proposer(Protocol):
    mode: str  # "chain" or "tree"
    size: int  # draft nodes per proposal
    path_len: int  # the most rows one verification accepts, the root included

    def reset(self) -> None: ...
    def observe_prompt(self, aux: torch.Tensor, next_tokens: torch.Tensor, pad: torch.Tensor) -> None: ...
    def observe(self, aux: torch.Tensor, next_tokens: torch.Tensor, m: torch.Tensor) -> None: ...
    def propose(self) -> Draft: ...


@dataclass
class Turn:
    tokens: list[int]
    seconds: float  # decode time (after prefill): the row's share of its batch's time
    accepts: list[int] = field(default_factory=list)  # accepted draft tokens per verification step
    drafted: list[int] = field(default_factory=list)  # draft tokens verified per step (an adaptive chain's vary)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _finish(tokens: list[int], max_new_tokens: int, stop_ids: set[int]) -> list[int]:
    tokens = tokens[:max_new_tokens]
    for i, t in enumerate(tokens):
        if t in stop_ids:
            return tokens[: i + 1]
    return tokens


def _prefill(engine: Engine, prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Logits at each prompt's last token [B, V], aux states [B, P, n_aux*H] and ids [B, P]
    of the left-padded prompts, and each row's padding [B]."""
    if isinstance(engine, TargetEngine):
        return engine.prefill_rows(prompts)
    ids = torch.tensor(prompts, device=engine.device)  # [1, P]: the generic engine holds one row
    logits, aux = engine.prefill(ids[0])
    return logits[-1:], aux[None], ids, torch.zeros(1, dtype=torch.long, device=engine.device)


def _forward(
    engine: Engine,
    ids: torch.Tensor,
    pad: torch.Tensor,
    n: torch.Tensor,
    n_host: list[int],
    block: torch.Tensor | None = None,
    offsets: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """ids [B, T] after each row's n tokens (`TargetEngine.rows_forward`). Returns logits [B, T, V], aux [B, T, n_aux*H]."""
    if isinstance(engine, TargetEngine):
        return engine.rows_forward(ids, pad, n, block, offsets)
    if block is None:  # the generic engine: one row, causal
        logits, aux = engine.chain(ids[0], n_host[0])
    else:  # or a draft tree under its mask
        logits, aux = engine.tree(ids[0], n_host[0], block[0], offsets[0])
    return logits[None], aux[None]


def _pick(sampling: Sampling, logits: torch.Tensor) -> torch.Tensor:
    """The target's next token of every row, logits [B, V] -> [B], on the device."""
    return logits.argmax(-1) if sampling.greedy else sampling.draws(sampling.probs(logits))


def _verify(
    engine: Engine,
    proposer: Proposer,
    draft: Draft,
    root: torch.Tensor,
    pad: torch.Tensor,
    n: torch.Tensor,
    n_host: list[int],
    sampling: Sampling,
    accept: Callable | None = None,
) -> tuple[torch.Tensor, torch.Tensor, list[list[int]], torch.Tensor]:
    """One verification of every row's draft after its n tokens (root [B, 1]: the last token,
    not yet in the target's cache). Returns the accepted counts [B], the new tokens [B, L] (the
    accepted drafts, then the bonus or corrected token), each row's new tokens on the host, and
    the aux states of the accepted rows [B, L, n_aux*H] (the first a+1 of each row are valid).
    `accept`: a tree's `tree_acceptance` (a chain needs none)."""
    tokens = draft.tokens.to(engine.device)  # [B, N]
    ids = torch.cat([root, tokens], dim=1)  # [B, N+1]: root + draft
    if proposer.mode == "chain":  # the accepted path is a prefix: its KV is in place already
        logits, aux = _forward(engine, ids, pad, n, n_host)
        if sampling.greedy:
            accepted, new, host = verify_chain_greedy(tokens, logits)
        else:
            accepted, new, host = verify_chain_sampled(tokens, draft.q, logits, sampling)
        return accepted, new, host, aux
    parents, depths, anc = (x.to(engine.device) for x in (draft.parents, draft.depths, draft.anc))
    offsets = torch.cat([depths[:, :1] * 0, depths], dim=1)  # [B, N+1]: positions after n (the root at n)
    logits, aux = _forward(engine, ids, pad, n, n_host, anc, offsets)
    accepted, new, acc_aux = accept(tokens, parents, depths, anc, logits, aux, pad, n)
    accepted, new, host = read_verified(accepted, new)
    return accepted, new, host, acc_aux


def _accept_tree(
    compact: Callable,
    sampling: Sampling,
    path_len: int,
    tokens: torch.Tensor,
    parents: torch.Tensor,
    depths: torch.Tensor,
    anc: torch.Tensor,
    logits: torch.Tensor,
    aux: torch.Tensor,
    pad: torch.Tensor,
    n: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A verified tree's acceptance (`tree_accept`), its accepted path's K/V moved into place by
    `compact` (a fixed shape: padding rows land where the next forward writes) and the path's aux
    states: tokens, parents, depths [B, N]; anc [B, N+1, N+1]; logits [B, N+1, V], aux [B, N+1, A]
    of the verification; pad, n [B]. Returns the accepted counts [B], the new tokens [B, path_len]
    and the path's aux states [B, path_len, A], all on the device."""
    accepted, path, new = tree_accept(tokens, parents, depths, anc, logits, sampling, path_len)
    slots = (pad + n)[:, None] + torch.arange(tokens.shape[1] + 1, device=tokens.device)  # [B, N+1]
    compact(slots.gather(1, path), slots[:, :path_len])
    return accepted, new, aux.gather(1, path[..., None].expand(-1, -1, aux.shape[-1]))


def no_draft(rows: int, size: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    """A tree of `size` nodes that no verification accepts (every token -1, which no argmax is),
    at slot 0 of `rows` rows: tokens, parents, depths [rows, size], ancestors [rows, N+1, N+1]
    (each row itself), pad and n [rows]. Its accepted path is the root then rows 1.. in order, so
    the compaction moves slots onto themselves: a graph's warm-up input that leaves the cache as
    it was."""
    long = torch.long
    return (
        torch.full((rows, size), -1, dtype=long, device=device),
        torch.zeros(rows, size, dtype=long, device=device),
        torch.ones(rows, size, dtype=long, device=device),
        torch.eye(size + 1, dtype=torch.bool, device=device).expand(rows, -1, -1),
        torch.zeros(rows, dtype=long, device=device),
        torch.zeros(rows, dtype=long, device=device),
    )


def tree_acceptance(engine: Engine, size: int, path_len: int, sampling: Sampling) -> Callable:
    """`_accept_tree` for drafts of `size` nodes. Where the verification of size+1 tokens is a CUDA
    graph of the fast engine and decoding is greedy: one more graph, captured once per engine and
    shape, which reads the verification graph's logits and aux states where that graph leaves
    them (no copy); eagerly its ~25 small kernels took 0.63 ms a cycle on an H100, against 0.22
    for a chain's acceptance (experiments/LOG.md 2026-12-06 07:55). Else eager. Its warm-up
    runs `no_draft`, so the cache is unchanged."""
    eager = functools.partial(_accept_tree, engine.compact, sampling, path_len)
    verify = engine.row_graphs.get(size + 1) if isinstance(engine, TargetEngine) else None
    if verify is None or not sampling.greedy:
        return eager
    v_logits, v_aux = verify.outputs  # [B, N+1, V], [B, N+1, A]: rewritten by each verification

    def accept(*draft_and_rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        tokens, parents, depths, anc, pad, n = draft_and_rows
        return _accept_tree(
            engine.compact_eager, sampling, path_len, tokens, parents, depths, anc, v_logits, v_aux, pad, n
        )

    graph = engine.graphed(
        ("tree_accept", engine.batch, size, path_len), accept, *no_draft(engine.batch, size, engine.device)
    )
    return lambda tokens, parents, depths, anc, _logits, _aux, pad, n: graph(
        tokens, parents, depths, anc, pad, n
    )  # the logits and aux states are the verification graph's outputs, read in place


def decode(
    engine: Engine,
    prompts: list[list[int]],
    max_new_tokens: int,
    stop_ids: set[int],
    sampling: Sampling,
    proposer: Proposer | None = None,
    width: int = 1,
) -> list[Turn]:
    """Answer `prompts` (one per engine row) by plain decoding, or by speculative decoding with
    `proposer`. `width` > 1 (plain only): each step's forward has the verification's shape, the
    token then width-1 copies of it after it, of which only the first row's logits are used
    (plain decoding through the verification kernels: bf16 rounding of that shape, no draft).
    Returns one Turn per prompt."""
    dev, rows = engine.device, len(prompts)
    logits, aux, ids, pad = _prefill(engine, prompts)
    first = _pick(sampling, logits)  # [B]
    size = proposer.size if proposer is not None else width - 1
    if proposer is not None:
        proposer.reset()
        proposer.observe_prompt(aux, torch.cat([ids[:, 1:], first[:, None]], dim=1), pad)  # state t, token t+1
    n_host, pad_host, new_host = [len(p) for p in prompts], pad.tolist(), [[t] for t in first.tolist()]
    n = torch.tensor(n_host, device=dev)  # [B]: tokens in the target's cache per row
    out, accepts, drafted = [list(t) for t in new_host], [[] for _ in prompts], [[] for _ in prompts]

    def running(i: int) -> bool:
        return (
            len(out[i]) < max_new_tokens
            and stop_ids.isdisjoint(new_host[i])
            and pad_host[i] + n_host[i] + size + 1 <= engine.max_len
        )

    alive = [running(i) for i in range(rows)]
    live = torch.tensor(alive, device=dev)  # [B]
    root = first[:, None]  # [B, 1]
    accept = (
        tree_acceptance(engine, size, proposer.path_len, sampling)
        if proposer is not None and proposer.mode == "tree"
        else None
    )
    _sync(dev)
    t0 = time.perf_counter()
    while any(alive):
        if proposer is None:
            new = _pick(sampling, _forward(engine, root.expand(-1, width), pad, n, n_host)[0][:, 0])[:, None]  # [B, 1]
            accepted, new_host, size_now = torch.zeros_like(n), new.tolist(), 0  # the one host read
        else:
            draft = proposer.propose()
            size_now = draft.tokens.shape[1]
            accepted, new, new_host, acc_aux = _verify(engine, proposer, draft, root, pad, n, n_host, sampling, accept)
        for i in range(rows):
            if alive[i]:
                out[i] += new_host[i]
                accepts[i].append(len(new_host[i]) - 1)
                drafted[i].append(size_now)
                n_host[i] += len(new_host[i])
        now = [alive[i] and running(i) for i in range(rows)]
        if now != alive:  # a row finished: park it at position 0 (a host-to-device copy, once per row)
            alive, live = now, torch.tensor(now, device=dev)
        m = (accepted + 1) * live  # [B]: new positions per row, 0 for a parked one
        n = (n + m) * live
        if proposer is not None:
            proposer.observe(acc_aux, new, m)
        root = new.gather(1, accepted[:, None])  # [B, 1]
    _sync(dev)
    seconds = (time.perf_counter() - t0) / rows
    return [
        Turn(_finish(o, max_new_tokens, stop_ids), seconds, *((a, d) if proposer is not None else ([], [])))
        for o, a, d in zip(out, accepts, drafted, strict=True)
    ]


def decode_all(
    engine: Engine,
    prompts: list[list[int]],
    max_new_tokens: int,
    stop_ids: set[int],
    sampling: Sampling,
    proposer: Proposer | None = None,
    done: Callable[[list[Turn]], None] | None = None,
    width: int = 1,
) -> list[Turn]:
    """`decode` of any number of prompts, in batches of the engine's rows (the last one filled
    up with copies of its first prompt, whose answers are dropped); `done(turns)` after each batch."""
    rows, out = getattr(engine, "batch", 1), []
    for i in range(0, len(prompts), rows):
        chunk = prompts[i : i + rows]
        turns = decode(
            engine, chunk + chunk[:1] * (rows - len(chunk)), max_new_tokens, stop_ids, sampling, proposer, width
        )[: len(chunk)]
        out += turns
        if done is not None:
            done(turns)
    return out


def plain_generate(
    engine: Engine, prompt: list[int], max_new_tokens: int, stop_ids: set[int], sampling: Sampling
) -> Turn:
    """One prompt by plain decoding (an engine of one row)."""
    return decode(engine, [prompt], max_new_tokens, stop_ids, sampling)[0]


def spec_generate(
    engine: Engine, proposer: Proposer, prompt: list[int], max_new_tokens: int, stop_ids: set[int], sampling: Sampling
) -> Turn:
    """One prompt by speculative decoding (an engine and a proposer of one row)."""
    return decode(engine, [prompt], max_new_tokens, stop_ids, sampling, proposer)[0]
