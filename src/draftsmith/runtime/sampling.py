"""Token choice and lossless verification of a draft (chain or tree) against the target.

Greedy (temperature 0): walk down the draft from the root, following the child whose token is
the target's argmax; the target's argmax at the last accepted node is the bonus token. The
output is the target's own greedy output, token for token. Chains and trees are verified on
the device with fixed shapes and one host transfer (`verify_chain_greedy`,
`verify_chain_sampled`, `verify_tree`).

Sampling (temperature, top-p): recursive rejection sampling. At each accepted node the
children are tried in order with the target's distribution `p` at that node:
  - a child drawn from a known draft distribution `q` (chain mode: standard speculative
    sampling) is accepted with probability min(1, p(x)/q(x)); on rejection
    p <- normalise(max(p - q, 0));
  - a child chosen deterministically (tree mode, EAGLE-2's top-k tree: q is a point mass) is
    accepted with probability p(x); on rejection p <- p with x removed, renormalised. With
    distinct siblings that is one draw y ~ p per node, followed down the tree (`verify_tree`).
When no child is accepted, the next token is sampled from the remaining `p`. Either way every
emitted token is distributed exactly as the target's own sampling. `residual=False` skips the
correction (tests show that the output distribution then differs from the target's).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


def target_probs(logits: torch.Tensor, temperature: float, top_p: float, top_k: int = 0) -> torch.Tensor:
    """Softmax of logits/temperature, cut to the top-k tokens (0: no cut), then to the top-p
    nucleus, renormalised (the order of HF's logits warpers). [.., V]"""
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if 0 < top_k < probs.shape[-1]:
        kth = probs.topk(top_k, dim=-1).values[..., -1:]  # [.., 1]
        probs = probs * (probs >= kth)
        probs = probs / probs.sum(-1, keepdim=True)
    if top_p >= 1.0:
        return probs
    sorted_p, order = probs.sort(dim=-1, descending=True)
    keep = (sorted_p.cumsum(-1) - sorted_p) < top_p  # the smallest prefix reaching top_p
    sorted_p = sorted_p * keep
    out = torch.zeros_like(probs).scatter_(-1, order, sorted_p)
    return out / out.sum(-1, keepdim=True)


def exponential_race(probs: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """One draw per row of probs [.., V] -> [..], on their device and without a host sync
    (torch.multinomial syncs to validate p): argmax(p / E) with E ~ Exp(1) picks token x with
    probability exactly p(x)."""
    noise = torch.empty(probs.shape, device=probs.device).exponential_(generator=gen)
    return (probs.float() / noise.clamp_min_(torch.finfo(noise.dtype).tiny)).argmax(-1)


@dataclass
class Sampling:
    """How the target's tokens are chosen (`temperature == 0` is greedy), for synth's answers and
    eval's verification alike. Owns the seeded random generators."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0  # 0: no top-k cut
    max_new_tokens: int = 256  # synth: the longest generation per request (eval passes its own per turn)
    seed: int = 0
    residual: bool = True  # the rejection-sampling correction; False only to prove it matters
    gen: torch.Generator = field(init=False, repr=False, compare=False)
    device_gens: dict[torch.device, torch.Generator] = field(init=False, repr=False, compare=False, default_factory=dict)

    def __post_init__(self) -> None:
        self.gen = torch.Generator().manual_seed(self.seed)

    def generator(self, device: torch.device) -> torch.Generator:
        """The random generator for tensors on `device` (the host one on CPU)."""
        if device.type == "cpu":
            return self.gen
        if device not in self.device_gens:
            self.device_gens[device] = torch.Generator(device).manual_seed(self.seed)
        return self.device_gens[device]

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        return target_probs(logits, self.temperature, self.top_p, self.top_k)

    def sample(self, probs: torch.Tensor) -> int:
        """One token from probs [V], on the host."""
        return int(self.draws(probs))

    def uniform(self) -> float:
        return float(torch.rand((), generator=self.gen))

    def draws(self, probs: torch.Tensor) -> torch.Tensor:
        """Tokens drawn from probs [.., V] where they lie, with no host sync."""
        return exponential_race(probs, self.generator(probs.device))

    def uniforms(self, n: int, device: torch.device) -> torch.Tensor:
        return torch.rand(n, device=device, generator=self.generator(device))  # [n]

    def to_dict(self) -> dict[str, float | int]:
        """The settings a synth output records."""
        return {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k,
                "max_new_tokens": self.max_new_tokens, "seed": self.seed}

    def pick(self, logits: torch.Tensor) -> int:
        """One token from target logits [V]."""
        return int(logits.argmax()) if self.greedy else self.sample(self.probs(logits))


def verify_chain_greedy(tokens: torch.Tensor, logits: torch.Tensor) -> tuple[int, torch.Tensor, list[int]]:
    """Greedy verification of a chain draft on the device: tokens [K] (target ids), logits
    [K+1, V] of the target at the root and at each draft token. Returns the accepted count a
    and the new tokens (the a accepted drafts, then the bonus token) on the device [a+1] and on
    the host, from one host transfer. Same as `verify`."""
    top = logits.argmax(-1)  # [K+1]
    accepted = (tokens == top[:-1]).cumprod(0).sum()  # []: the matching prefix
    a, *host = torch.cat([accepted[None], top]).tolist()  # [K+2]: the one host sync
    return a, top[: a + 1], host[: a + 1]


def verify_chain_sampled(tokens: torch.Tensor, q: torch.Tensor | None, logits: torch.Tensor,
                         sampling: Sampling) -> tuple[int, torch.Tensor, list[int]]:
    """Speculative sampling of a chain draft on the device, the rule of `verify` on a chain:
    draft i (drawn from q [K, V]; None: point masses) is accepted with probability
    min(1, p_i(x)/q_i(x)) while all before it were; at the first rejection j the next token is
    drawn from normalise(max(p_j - q_j, 0)), or from p_K when all K were accepted. One host
    transfer. Returns the accepted count a and the new tokens [a+1] on the device and the host."""
    k = tokens.shape[0]
    p = sampling.probs(logits)  # [K+1, V]
    if q is None:
        q = torch.nn.functional.one_hot(tokens, p.shape[-1]).float()  # [K, V]
    px = p[:k].gather(1, tokens[:, None])[:, 0]  # [K]
    qx = q.gather(1, tokens[:, None])[:, 0]  # [K]
    ok = sampling.uniforms(k, p.device) * qx < px  # [K]
    accepted = ok.long().cumprod(0).sum()  # []
    p_a = p.index_select(0, accepted[None])[0]  # [V]: the target at the first rejected row (or row K)
    if sampling.residual:
        q_a = torch.cat([q, torch.zeros_like(q[:1])]).index_select(0, accepted[None])[0]  # [V]; row K: 0
        res = (p_a - q_a).clamp(min=0)
        total = res.sum()
        p_a = torch.where(total > 0, res / total.clamp(min=torch.finfo(res.dtype).tiny), p_a)
    nxt = sampling.draws(p_a)  # []
    a, *host = torch.cat([accepted[None], tokens, nxt[None]]).tolist()  # [K+2]: the one host sync
    return a, torch.cat([tokens[:a], nxt[None]]), host[:a] + host[-1:]




def verify_tree(tokens: torch.Tensor, parents: torch.Tensor, depths: torch.Tensor, anc: torch.Tensor,
                logits: torch.Tensor, sampling: Sampling, path_len: int) -> tuple[int, torch.Tensor, torch.Tensor, list[int]]:
    """Lossless verification of a tree draft on the device, with fixed shapes and one host
    transfer. tokens, parents (rows: node i is row i+1, row 0 the root), depths [N], with
    siblings carrying distinct tokens (top-k children); anc [N+1, N+1]: row r sees row c iff c
    is r or an ancestor of r; logits [N+1, V] of the target at every row; path_len: a bound on
    the accepted rows (the draft's depth + 1, at most N+1).

    The rule: every row chooses the target's next token there (the argmax, or one draw y ~ p),
    the accepted path is the deepest row whose every node's token is its parent's choice, and
    the next token is that row's choice. When sampling this is recursive rejection sampling
    with point-mass proposals (accept child x with probability p(x), else remove x from p and
    try the next child, else sample from what is left): both emit child x with probability p(x)
    and, when no child is taken, a token from p without the children, so one draw followed down
    the tree is exact. `residual=False` (tests only) skips that correction: the next token is
    drawn afresh from the whole p.

    Returns the accepted count a, the path rows root first [path_len] (rows after a are
    padding: a fixed shape for the KV compaction), and the new tokens (a accepted drafts, then
    the next token) on the device [a+1] and on the host."""
    rows = torch.arange(tokens.shape[0] + 1, device=tokens.device)  # [N+1]
    probs = None if sampling.greedy else sampling.probs(logits)  # [N+1, V]
    choice = logits.argmax(-1) if probs is None else sampling.draws(probs)  # [N+1]
    ok = torch.cat([rows[:1] == 0, tokens == choice.index_select(0, parents)])  # [N+1]: the root, and nodes their parent chose
    on_path = ~(anc & ~ok[None, :]).any(-1)  # [N+1]: every node from the root down to the row was chosen
    row_depth = torch.cat([rows[:1] * 0, depths])  # [N+1]
    best = (row_depth * on_path).argmax()  # []: the deepest accepted row (one path: siblings differ)
    accepted = row_depth.index_select(0, best[None])  # [1]
    seen = anc.index_select(0, best[None])[0]  # [N+1]: the path's rows
    path = (rows + (~seen) * rows.shape[0]).argsort()[:path_len]  # [path_len]: the path's rows in depth order, then padding
    nxt = choice.index_select(0, best[None])  # [1]
    if probs is not None and not sampling.residual:
        nxt = sampling.draws(probs.index_select(0, best[None]))  # [1]
    drafted = torch.cat([rows[:1], tokens]).index_select(0, path[1:])  # [path_len-1]: the path's tokens after the root
    new = torch.where(rows[:path_len] == accepted, nxt, torch.cat([drafted, nxt]))  # [path_len]: the next token at index a
    a, *host = torch.cat([accepted, new]).tolist()  # [path_len+1]: the one host sync
    return a, path, new[: a + 1], host[: a + 1]
