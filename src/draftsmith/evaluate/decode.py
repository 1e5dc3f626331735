"""The two decoding loops that `draftsmith eval` compares, over the same `TargetEngine`:
plain decoding (one target forward per token) and speculative decoding (draft, verify in one
forward with the draft's tree mask, compact the accepted path's KV, feed the drafter the aux
states of the accepted positions).

Both time decoding only: the clock starts after the prompt's prefill and stops after the last
token, with the device synchronised. Both stop at a stop token (kept) or after
`max_new_tokens`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol

import torch

from draftsmith.evaluate.engine import TargetEngine
from draftsmith.evaluate.proposer import Draft, ancestors
from draftsmith.evaluate.sampling import Sampling, verify


class Proposer(Protocol):
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


def plain_generate(engine: TargetEngine, prompt: list[int], max_new_tokens: int, stop_ids: set[int],
                   sampling: Sampling) -> Turn:
    dev = engine.device
    logits, _ = engine.prefill(torch.tensor(prompt, device=dev))
    _sync(dev)
    t0 = time.perf_counter()
    tok, n = sampling.pick(logits[-1]), len(prompt)
    out = [tok]
    while len(out) < max_new_tokens and tok not in stop_ids and n < engine.max_len:
        pos = torch.tensor([n], device=dev)
        logits, _ = engine.forward(torch.tensor([tok], device=dev), pos, pos, engine.causal_mask(n, 1))
        tok, n = sampling.pick(logits[0]), n + 1
        out.append(tok)
    _sync(dev)
    return Turn(out, time.perf_counter() - t0)


def spec_generate(engine: TargetEngine, proposer: Proposer, prompt: list[int], max_new_tokens: int,
                  stop_ids: set[int], sampling: Sampling) -> Turn:
    dev = engine.device
    ids = torch.tensor(prompt, device=dev)
    logits, aux = engine.prefill(ids)
    _sync(dev)
    t0 = time.perf_counter()
    tok, n = sampling.pick(logits[-1]), len(prompt)
    out, accepts = [tok], []
    proposer.reset()
    proposer.observe(aux, torch.cat([ids[1:], torch.tensor([tok], device=dev)]))  # state t, token t+1
    while len(out) < max_new_tokens and not stop_ids.intersection(out) and n + proposer.size + 1 <= engine.max_len:
        draft = proposer.propose()
        t = draft.tokens.shape[0] + 1
        rows = torch.cat([torch.tensor([tok], device=dev), draft.tokens.to(dev)])  # [T]: root + draft
        pos = n + torch.cat([torch.zeros(1, dtype=torch.long), draft.depths.cpu()]).to(dev)  # [T]
        slots = torch.arange(n, n + t, device=dev)
        logits, aux = engine.forward(rows, pos, slots, engine.tree_mask(n, ancestors(draft.parents).to(dev)))
        path, tok = verify(draft.tokens.tolist(), draft.parents, logits, sampling, draft.q)
        path_t = torch.tensor(path, device=dev)
        engine.compact(slots[path_t], slots[: len(path)])
        new = torch.cat([rows[path_t[1:]], torch.tensor([tok], device=dev)])  # accepted drafts + next token
        proposer.observe(aux[path_t], new)
        out += new.tolist()
        accepts.append(len(path) - 1)
        n += len(path)
    _sync(dev)
    return Turn(_finish(out, max_new_tokens, stop_ids), time.perf_counter() - t0, accepts)
