"""Token choice and lossless verification of a draft (chain or tree) against the target.

Greedy (temperature 0): walk down the draft from the root, following the child whose token is
the target's argmax; the target's argmax at the last accepted node is the bonus token, so the
output is the target's own greedy output. Chains and trees are verified on the device with fixed
shapes and one host transfer (`verify_chain_greedy`, `verify_chain_sampled`; a tree's `tree_accept`,
then `read_verified`).

Sampling (temperature, top-p): recursive rejection sampling with the target's distribution `p`
at each accepted node. A child drawn from a known draft distribution `q` (chain mode) is
accepted with probability min(1, p(x)/q(x)), on rejection p <- normalise(max(p - q, 0)); a child
chosen deterministically (tree mode, EAGLE-2's top-k: q a point mass) with probability p(x), on
rejection p <- p without x, renormalised. When no child is accepted the next token is sampled
from the remaining `p`, so every emitted token is distributed as the target's own sampling.
`residual=False` skips the correction (tests show the output distribution then differs).
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


def race(probs: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """One draw per row of probs [.., V] -> [..], on their device and without a host sync
    (torch.multinomial syncs to validate p): argmax(p / E) with E ~ Exp(1) (`noise`, of probs'
    shape, fresh for each draw) picks token x with probability exactly p(x)."""
    return (probs.float() / noise.clamp_min(torch.finfo(noise.dtype).tiny)).argmax(-1)


def exponential_race(probs: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """`race` with noise drawn from `gen`."""
    return race(probs, torch.empty(probs.shape, device=probs.device).exponential_(generator=gen))


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
    device_gens: dict[torch.device, torch.Generator] = field(
        init=False, repr=False, compare=False, default_factory=dict
    )

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

    def draws(self, probs: torch.Tensor) -> torch.Tensor:
        """Tokens drawn from probs [.., V] where they lie, with no host sync."""
        return exponential_race(probs, self.generator(probs.device))

    def uniforms(self, n: int, device: torch.device) -> torch.Tensor:
        return torch.rand(n, device=device, generator=self.generator(device))  # [n]

    def to_dict(self) -> dict[str, float | int]:
        """The settings a synth output records."""
        return {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "max_new_tokens": self.max_new_tokens,
            "seed": self.seed,
        }


Verified = tuple[
    torch.Tensor, torch.Tensor, list[list[int]]
]  # accepted [B], new tokens [B, L], each row's new tokens on the host


def read_verified(accepted: torch.Tensor, new: torch.Tensor) -> Verified:
    """The one host transfer of a verification: accepted [B] and new [B, L] (row b: its a
    accepted drafts, then the next token at index a, then padding). Returns both and each row's
    a+1 new tokens as host lists."""
    rows = torch.cat([accepted[:, None], new], dim=1).tolist()  # [B, L+1]: the one host sync
    return accepted, new, [r[1 : r[0] + 2] for r in rows]


def verify_chain_greedy(tokens: torch.Tensor, logits: torch.Tensor) -> Verified:
    """Greedy verification of chain drafts on the device: tokens [B, K] (target ids), logits
    [B, K+1, V] of the target at the root and at each draft token. The accepted count is the
    matching prefix; the new tokens are the target's argmax at the root and each draft [B, K+1]."""
    top = logits.argmax(-1)  # [B, K+1]
    accepted = (tokens == top[:, :-1]).long().cumprod(1).sum(1)  # [B]: the matching prefix
    return read_verified(accepted, top)


def verify_chain_sampled(
    tokens: torch.Tensor, q: torch.Tensor | None, logits: torch.Tensor, sampling: Sampling
) -> Verified:
    """Speculative sampling of chain drafts on the device: draft i (drawn from q [B, K, V];
    None: point masses) is accepted with probability min(1, p_i(x)/q_i(x)) while all before it
    were; at the first rejection j the next token is drawn from normalise(max(p_j - q_j, 0)), or
    from p_K when all K were accepted. tokens [B, K], logits [B, K+1, V]."""
    b, k = tokens.shape
    p = sampling.probs(logits)  # [B, K+1, V]
    if q is None:
        q = torch.nn.functional.one_hot(tokens, p.shape[-1]).float()  # [B, K, V]
    px = p[:, :k].gather(2, tokens[..., None])[..., 0]  # [B, K]
    qx = q.gather(2, tokens[..., None])[..., 0]  # [B, K]
    ok = sampling.uniforms(b * k, p.device).view(b, k) * qx < px  # [B, K]
    accepted = ok.long().cumprod(1).sum(1)  # [B]
    at = accepted[:, None, None].expand(b, 1, p.shape[-1])  # [B, 1, V]
    p_a = p.gather(1, at)[:, 0]  # [B, V]: the target at the first rejected row (or row K)
    if sampling.residual:
        q_a = torch.cat([q, torch.zeros_like(q[:, :1])], dim=1).gather(1, at)[:, 0]  # [B, V]; row K: 0
        res = (p_a - q_a).clamp(min=0)
        total = res.sum(-1, keepdim=True)  # [B, 1]
        p_a = torch.where(total > 0, res / total.clamp(min=torch.finfo(res.dtype).tiny), p_a)
    nxt = sampling.draws(p_a)  # [B]
    step = torch.arange(k + 1, device=p.device)  # [K+1]
    return read_verified(
        accepted, torch.where(step == accepted[:, None], nxt[:, None], torch.cat([tokens, nxt[:, None]], dim=1))
    )


def tree_accept(
    tokens: torch.Tensor,
    parents: torch.Tensor,
    depths: torch.Tensor,
    anc: torch.Tensor,
    logits: torch.Tensor,
    sampling: Sampling,
    path_len: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Lossless verification of tree drafts on the device, with fixed shapes and no host
    transfer (greedy: a CUDA graph can hold it). tokens, parents (rows: node i is row i+1, row 0 the root), depths [B, N], with
    siblings carrying distinct tokens (top-k children); anc [B, N+1, N+1]: row r sees row c iff
    c is r or an ancestor of r; logits [B, N+1, V] of the target at every row; path_len: a bound
    on the accepted rows (the draft's depth + 1, at most N+1).

    The rule: every row chooses the target's next token there (the argmax, or one draw y ~ p),
    the accepted path is the deepest row whose every node's token is its parent's choice, and
    the next token is that row's choice. When sampling this is recursive rejection sampling
    with point-mass proposals (accept child x with probability p(x), else remove x from p and
    try the next child, else sample from what is left): both emit child x with probability p(x)
    and, when no child is taken, a token from p without the children, so one draw followed down
    the tree is exact. `residual=False` (tests only) skips that correction: the next token is
    drawn afresh from the whole p.

    Returns the accepted counts [B], the path rows root first [B, path_len] (rows after a are
    padding: a fixed shape for the KV compaction) and the new tokens [B, path_len] (a accepted
    drafts, then the next token)."""
    b, n = tokens.shape
    rows = torch.arange(n + 1, device=tokens.device)  # [N+1]
    probs = None if sampling.greedy else sampling.probs(logits)  # [B, N+1, V]
    choice = logits.argmax(-1) if probs is None else sampling.draws(probs)  # [B, N+1]
    ok = torch.cat(
        [tokens[:, :1] >= 0, tokens == choice.gather(1, parents)], dim=1
    )  # [B, N+1]: the root, nodes their parent chose
    on_path = ~(anc & ~ok[:, None, :]).any(-1)  # [B, N+1]: every node from the root down to the row was chosen
    row_depth = torch.cat([depths[:, :1] * 0, depths], dim=1)  # [B, N+1]
    best = (row_depth * on_path).argmax(
        -1, keepdim=True
    )  # [B, 1]: the deepest accepted row (one path: siblings differ)
    accepted = row_depth.gather(1, best)[:, 0]  # [B]
    seen = anc.gather(1, best[..., None].expand(b, 1, n + 1))[:, 0]  # [B, N+1]: the path's rows
    path = (rows + (~seen) * (n + 1)).argsort(-1)[
        :, :path_len
    ]  # [B, path_len]: the path's rows in depth order, then padding
    nxt = choice.gather(1, best)  # [B, 1]
    if probs is not None and not sampling.residual:
        nxt = sampling.draws(probs.gather(1, best[..., None].expand(b, 1, probs.shape[-1])))  # [B, 1]
    drafted = torch.cat([tokens[:, :1], tokens], dim=1).gather(
        1, path[:, 1:]
    )  # [B, path_len-1]: the path's tokens after the root
    new = torch.where(rows[:path_len] == accepted[:, None], nxt, torch.cat([drafted, nxt], dim=1))  # [B, path_len]
    return accepted, path, new
