"""Token choice and lossless verification of a draft (chain or tree) against the target.

Greedy (temperature 0): walk down the draft from the root, following the child whose token is
the target's argmax; the target's argmax at the last accepted node is the bonus token. The
output is the target's own greedy output, token for token. A greedy chain is verified on the
device with one host transfer (`verify_chain_greedy`).

Sampling (temperature, top-p): recursive rejection sampling. At each accepted node the
children are tried in order with the target's distribution `p` at that node:
  - a child drawn from a known draft distribution `q` (chain mode: standard speculative
    sampling) is accepted with probability min(1, p(x)/q(x)); on rejection
    p <- normalise(max(p - q, 0));
  - a child chosen deterministically (tree mode, EAGLE-2's top-k tree: q is a point mass) is
    accepted with probability p(x); on rejection p <- p with x removed, renormalised.
When no child is accepted, the next token is sampled from the remaining `p`. Either way every
emitted token is distributed exactly as the target's own sampling. `residual=False` skips the
correction (tests show that the output distribution then differs from the target's).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


def target_probs(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """Softmax of logits/temperature, restricted to the top-p nucleus and renormalised. [.., V]"""
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p >= 1.0:
        return probs
    sorted_p, order = probs.sort(dim=-1, descending=True)
    keep = (sorted_p.cumsum(-1) - sorted_p) < top_p  # the smallest prefix reaching top_p
    sorted_p = sorted_p * keep
    out = torch.zeros_like(probs).scatter_(-1, order, sorted_p)
    return out / out.sum(-1, keepdim=True)


@dataclass
class Sampling:
    """How tokens are chosen; `temperature == 0` is greedy. Owns the random generator."""

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    residual: bool = True  # the rejection-sampling correction; False only to prove it matters
    gen: torch.Generator = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.gen = torch.Generator().manual_seed(self.seed)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        return target_probs(logits, self.temperature, self.top_p)

    def sample(self, probs: torch.Tensor) -> int:
        return int(torch.multinomial(probs.float().cpu(), 1, generator=self.gen))

    def uniform(self) -> float:
        return float(torch.rand((), generator=self.gen))

    def pick(self, logits: torch.Tensor) -> int:
        """One token from target logits [V]."""
        return int(logits.argmax()) if self.greedy else self.sample(self.probs(logits))


def children_of(parents: list[int]) -> list[list[int]]:
    """Row r's children rows, in draft order. Row 0 is the root, draft node i is row i+1."""
    children: list[list[int]] = [[] for _ in range(len(parents) + 1)]
    for i, p in enumerate(parents):
        children[p].append(i + 1)
    return children


def verify_chain_greedy(tokens: torch.Tensor, logits: torch.Tensor) -> tuple[int, torch.Tensor, list[int]]:
    """Greedy verification of a chain draft on the device: tokens [K] (target ids), logits
    [K+1, V] of the target at the root and at each draft token. Returns the accepted count a,
    the target's argmax per row `top` [K+1] (on the device; top[:a+1] = the accepted drafts,
    then the bonus token) and top[:a+1] on the host, from one host transfer. Same as `verify`."""
    top = logits.argmax(-1)  # [K+1]
    accepted = (tokens == top[:-1]).cumprod(0).sum()  # []: the matching prefix
    a, *host = torch.cat([accepted[None], top]).tolist()  # [K+2]: the one host sync
    return a, top, host[: a + 1]


def verify(tokens: list[int], parents: list[int], logits: torch.Tensor, sampling: Sampling,
           q: torch.Tensor | None = None) -> tuple[list[int], int]:
    """tokens/parents: the draft (node i is row i+1, its parent a row); logits [N+1, V] of the
    target at every row; q [N, V]: the distribution node i was drawn from (None: point masses).
    Returns the accepted rows (root first) and the next token (bonus or correction)."""
    children = children_of(parents)
    path, row = [0], 0
    if sampling.greedy:
        top = logits.argmax(-1).tolist()
        while True:
            nxt = next((c for c in children[row] if tokens[c - 1] == top[row]), None)
            if nxt is None:
                return path, top[row]
            path.append(nxt)
            row = nxt
    probs = sampling.probs(logits)  # [N+1, V]
    while True:
        p, accepted = probs[row], None
        for c in children[row]:
            x = tokens[c - 1]
            qx = float(q[c - 1, x]) if q is not None else 1.0
            if sampling.uniform() * qx < float(p[x]):
                accepted = c
                break
            if sampling.residual:
                if q is not None:
                    p = torch.clamp(p - q[c - 1], min=0)
                else:
                    p = p.clone()
                    p[x] = 0
                total = p.sum()
                p = p / total if total > 0 else probs[row]
        if accepted is None:
            return path, sampling.sample(p)
        path.append(accepted)
        row = accepted
