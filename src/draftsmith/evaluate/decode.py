"""The two decoding loops that `draftsmith eval` compares, over the same engine (the fast
`TargetEngine`, or for targets that fail its self-check the generic `HFEngine`, chain only):
plain decoding (one target forward per token) and speculative decoding (draft, verify in one
forward with the draft's tree mask, compact the accepted path's KV, feed the drafter the aux
states of the accepted positions). Chain verification, greedy or sampled, stays on the device
(causal mask, no compaction: the accepted path is a prefix) with one host sync per cycle.

Both time decoding only: the clock starts after the prompt's prefill and stops after the last
token, with the device synchronised. Both stop at a stop token (kept) or after
`max_new_tokens`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol

import torch

from draftsmith.evaluate.proposer import Draft, ancestors
from draftsmith.runtime.engine import TargetEngine
from draftsmith.runtime.sampling import Sampling, verify, verify_chain_greedy, verify_chain_sampled
from draftsmith.runtime.selfcheck import Engine


class Proposer(Protocol):
    mode: str  # "chain" or "tree"
    size: int

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


def _verify_tree(engine: TargetEngine, draft: Draft, root: torch.Tensor, n: int,
                 sampling: Sampling) -> tuple[list[int], torch.Tensor, torch.Tensor]:
    """The same for any draft (a chain is a tree) and any sampling: the tree-mask forward,
    `verify` on the host, then compaction of the accepted path's KV when it is not a prefix."""
    dev = engine.device
    tokens = draft.tokens.to(dev)
    t = tokens.shape[0] + 1
    rows = torch.cat([root, tokens])  # [T]: root + draft
    depths = draft.depths.to(dev)
    pos = n + torch.cat([torch.zeros_like(depths[:1]), depths])  # [T]
    slots = torch.arange(n, n + t, device=dev)
    logits, aux = engine.forward(rows, pos, slots, engine.tree_mask(n, ancestors(draft.parents).to(dev)))
    host_tokens = tokens.tolist()
    path, tok = verify(host_tokens, draft.parents, logits, sampling, draft.q)
    new = [host_tokens[r - 1] for r in path[1:]] + [tok]  # accepted drafts + next token
    path_new = torch.tensor(path + new, device=dev)  # [2 * len(path)]: one host-to-device copy
    path_t, new_t = path_new[: len(path)], path_new[len(path) :]
    if path != list(range(len(path))):
        engine.compact(slots[path_t], slots[: len(path)])
    return new, aux[path_t], new_t


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
    if proposer.mode == "chain":
        step = _verify_chain
    else:
        assert isinstance(engine, TargetEngine), "tree verification needs the fast engine (open_engine refuses it otherwise)"
        step = _verify_tree
    while len(out) < max_new_tokens and stop_ids.isdisjoint(new) and n + proposer.size + 1 <= engine.max_len:
        draft = proposer.propose()
        new, aux, next_tokens = step(engine, draft, root, n, sampling)
        proposer.observe(aux, next_tokens)
        root = next_tokens[-1:]
        out += new
        accepts.append(len(new) - 1)
        n += len(new)
    _sync(dev)
    return Turn(_finish(out, max_new_tokens, stop_ids), time.perf_counter() - t0, accepts)
