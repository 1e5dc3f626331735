"""The two decoding loops that `draftsmith eval` compares, over the same engine (the fast
`TargetEngine`, or for targets that fail its self-check the generic `HFEngine`, chain only):
plain decoding (one target forward per token) and speculative decoding (draft, verify in one
forward with the draft's tree mask, compact the accepted path's KV, feed the drafter the aux
states of the accepted positions). Verification, chain or tree, greedy or sampled, stays on
the device with fixed shapes and one host sync per cycle (a chain: causal mask, no compaction,
the accepted path is a prefix; a tree: the draft's tree mask and a fixed-shape KV compaction).

Both time decoding only: the clock starts after the prompt's prefill and stops after the last
token, with the device synchronised. Both stop at a stop token (kept) or after
`max_new_tokens`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol

import torch

from draftsmith.evaluate.proposer import Draft
from draftsmith.runtime.engine import TargetEngine
from draftsmith.runtime.sampling import Sampling, verify_chain_greedy, verify_chain_sampled, verify_tree
from draftsmith.runtime.selfcheck import Engine


class Proposer(Protocol):
    mode: str  # "chain" or "tree"
    size: int  # draft nodes per proposal
    path_len: int  # the most rows one verification accepts, the root included

    def reset(self) -> None: ...
    def observe(self, aux: torch.Tensor, next_tokens: torch.Tensor) -> None: ...
    def propose(self) -> Draft: ...


@dataclass
class Turn:
    tokens: list[int]
    seconds: float  # decode time (after prefill)
    accepts: list[int] = field(default_factory=list)  # accepted draft tokens per verification step


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _finish(tokens: list[int], max_new_tokens: int, stop_ids: set[int]) -> list[int]:
    tokens = tokens[:max_new_tokens]
    for i, t in enumerate(tokens):
        if t in stop_ids:
            return tokens[: i + 1]
    return tokens


def plain_generate(engine: Engine, prompt: list[int], max_new_tokens: int, stop_ids: set[int],
                   sampling: Sampling) -> Turn:
    dev = engine.device
    logits, _ = engine.prefill(torch.tensor(prompt, device=dev))
    _sync(dev)
    t0 = time.perf_counter()
    tok, n = sampling.pick(logits[-1]), len(prompt)
    out = [tok]
    while len(out) < max_new_tokens and tok not in stop_ids and n < engine.max_len:
        logits, _ = engine.chain(torch.tensor([tok], device=dev), n)
        tok, n = sampling.pick(logits[0]), n + 1
        out.append(tok)
    _sync(dev)
    return Turn(out, time.perf_counter() - t0)


def _verify_chain(engine: Engine, draft: Draft, root: torch.Tensor, n: int,
                  sampling: Sampling) -> tuple[list[int], torch.Tensor, torch.Tensor]:
    """One verification step of a chain draft: inputs built on the device, acceptance on the
    device (greedy or speculative sampling), one host sync. The accepted path is a prefix, so
    its KV is already in place (no compaction; the next `chain` call overwrites or crops the
    rejected rest). Returns the new tokens (accepted drafts + the bonus or corrected token),
    the accepted rows' aux states and the new tokens on the device."""
    tokens = draft.tokens.to(engine.device)
    logits, aux = engine.chain(torch.cat([root, tokens]), n)  # root + chain at n..n+K
    if sampling.greedy:
        a, new_t, new = verify_chain_greedy(tokens, logits)
    else:
        a, new_t, new = verify_chain_sampled(tokens, draft.q, logits, sampling)
    return new, aux[: a + 1], new_t


def _verify_tree(engine: TargetEngine, draft: Draft, root: torch.Tensor, n: int, sampling: Sampling,
                 path_len: int) -> tuple[list[int], torch.Tensor, torch.Tensor]:
    """The same for a tree draft: the forward under the tree mask (built on the device from the
    draft's ancestor mask), `verify_tree` on the device with one host sync, then the accepted
    path's KV moved to slots n.. by a fixed-shape copy of `path_len` rows (the padding rows land
    on slots that the next verification overwrites)."""
    dev = engine.device
    rows = torch.cat([root, draft.tokens])  # [N+1]: root + draft
    pos = n + torch.cat([torch.zeros_like(draft.depths[:1]), draft.depths])  # [N+1]
    slots = torch.arange(n, n + rows.shape[0], device=dev)  # [N+1]
    logits, aux = engine.forward(rows, pos, slots, engine.tree_mask(n, draft.anc))
    a, path, new_t, new = verify_tree(draft.tokens, draft.parents, draft.depths, draft.anc, logits, sampling, path_len)
    engine.compact(slots.index_select(0, path), slots[:path_len])
    return new, aux.index_select(0, path[: a + 1]), new_t


def spec_generate(engine: Engine, proposer: Proposer, prompt: list[int], max_new_tokens: int,
                  stop_ids: set[int], sampling: Sampling) -> Turn:
    dev = engine.device
    ids = torch.tensor(prompt, device=dev)
    logits, aux = engine.prefill(ids)
    _sync(dev)
    t0 = time.perf_counter()
    tok, n = sampling.pick(logits[-1]), len(prompt)
    root = torch.tensor([tok], device=dev)  # [1]: the last token, not yet in the target's cache
    new, out, accepts = [tok], [tok], []
    proposer.reset()
    proposer.observe(aux, torch.cat([ids[1:], root]))  # state t, token t+1
    if proposer.mode == "tree":
        assert isinstance(engine, TargetEngine), "tree verification needs the fast engine (open_engine refuses it otherwise)"
    while len(out) < max_new_tokens and stop_ids.isdisjoint(new) and n + proposer.size + 1 <= engine.max_len:
        draft = proposer.propose()
        if proposer.mode == "chain":
            new, aux, next_tokens = _verify_chain(engine, draft, root, n, sampling)
        else:
            new, aux, next_tokens = _verify_tree(engine, draft, root, n, sampling, proposer.path_len)
        proposer.observe(aux, next_tokens)
        root = next_tokens[-1:]
        out += new
        accepts.append(len(new) - 1)
        n += len(new)
    _sync(dev)
    return Turn(_finish(out, max_new_tokens, stop_ids), time.perf_counter() - t0, accepts)
