"""`--depth auto`, `--tree auto` and `--stop-below auto`: the draft shape that maximises the
expected decode speed, chosen from a short calibration on the engine and drafter at hand (before
the measured run).

    predicted speed-up(s) = E(s) / c(s) · t_plain

E(s) is the expected tokens per target call with shape s: for a chain of K, 1 + Σ_{i≤K} Π_{j≤i}
a_j from the conditional acceptances a_i of the longest chain (one measurement serves every K);
for a tree, each shape's own measured tokens per call (a smaller tree is not a prefix of a
larger one). c(s) is the measured seconds per draft-and-verify cycle of each shape (its own
proposer and, on GPU, its own CUDA graphs; at batch size B, each row's share), t_plain the
seconds per token of plain decoding on the same prompts. The calibration prompts are the first
turns of a few of the run's questions spread evenly over its list, each decoded to the run's
own length per turn; their answers are not part of the reported figures. Why so, and how far
the prediction reads: docs/eval.md.

`--stop-below auto` adds one candidate to the chains': the longest of them as an adaptive chain
(`Shape.stop_below`), at the threshold the chains' measured costs give (`adaptive_threshold`),
its tokens per call and cycle time measured on the same prompts rather than predicted.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

from draftsmith.errors import UserError
from draftsmith.evaluate.config import oversized_tree
from draftsmith.evaluate.decode import Proposer, Turn, decode_all
from draftsmith.runtime.engine_choice import Engine
from draftsmith.runtime.sampling import Sampling


@dataclass(frozen=True)
class Shape:
    """A draft shape: a chain of `depth`, or a tree (`top_k` and `total_tokens` set); a chain with
    `stop_below` stops drafting early once no row's confidence in its draft reaches it (an
    adaptive chain, at most `depth` long)."""

    depth: int
    top_k: int | None = None
    total_tokens: int | None = None
    stop_below: float | None = None

    @property
    def label(self) -> str:
        if self.top_k is not None:
            return f"{self.total_tokens}x{self.depth}x{self.top_k}"
        return f"K={self.depth}" + ("" if self.stop_below is None else f" stop<{self.stop_below:.3g}")

    @classmethod
    def parse_tree(cls, text: str) -> Shape:
        """'TOTALxDEPTHxTOPK', e.g. '60x7x10'."""
        try:
            total, depth, top_k = (int(v) for v in text.lower().split("x"))
        except ValueError:
            raise UserError(f"tree shape {text!r}: expected TOTALxDEPTHxTOPK, e.g. 60x7x10") from None
        if min(total, depth, top_k) < 1:
            raise UserError(f"tree shape {text!r}: every number must be >= 1")
        if (why := oversized_tree(total, depth, top_k)) is not None:
            raise UserError(f"tree shape {text!r}: {why}")
        return cls(depth, top_k, total)


@dataclass
class Candidate:
    shape: Shape
    expected_tokens: float  # E(s): tokens per target call
    cycle_seconds: float  # c(s)
    drafted: float | None = None  # measured draft tokens per call (the chain's length, the tree's size; fewer adaptive)


@dataclass
class Calibration:
    mode: str  # "chain" or "tree"
    candidates: list[Candidate]
    plain_seconds: float  # seconds per plain token
    tokens: int  # calibration tokens decoded (chain: at K_max; tree: by every shape)
    accept_cond: list[float] | None = None  # chain: a_1..a_Kmax

    def break_even(self, c: Candidate) -> float:
        """A cycle's cost in plain tokens: the tau from which it pays on this machine."""
        return c.cycle_seconds / self.plain_seconds

    def predicted_speedup(self, c: Candidate) -> float:
        return c.expected_tokens / self.break_even(c)

    def best(self) -> Candidate:
        return max(self.candidates, key=self.predicted_speedup)

    def to_dict(self) -> dict[str, Any]:
        best = self.best()
        return {
            "mode": self.mode,
            "accept_cond": self.accept_cond,
            "plain_seconds": self.plain_seconds,
            "tokens": self.tokens,
            "chosen": best.shape.label,
            "chosen_shape": asdict(best.shape),
            "chosen_depth": best.shape.depth,
            "predicted_speedup": round(self.predicted_speedup(best), 4),
            "break_even_tau": round(self.break_even(best), 4),
            "candidates": [
                {
                    "shape": c.shape.label,
                    **asdict(c.shape),
                    "expected_tokens": round(c.expected_tokens, 4),
                    "cycle_ms": round(1e3 * c.cycle_seconds, 3),
                    "drafted_per_cycle": None if c.drafted is None else round(c.drafted, 4),
                    "predicted_speedup": round(self.predicted_speedup(c), 4),
                }
                for c in self.candidates
            ],
        }


def spread(n: int, m: int) -> list[int]:
    """m indices spread evenly over range(n), the middle of each of m equal parts (all n when m >= n)."""
    if m >= n:
        return list(range(n))
    return [(2 * i + 1) * n // (2 * m) for i in range(m)]


def expected_tokens(accept_cond: list[float], k: int) -> float:
    """E(K) = 1 + Σ_{i≤K} Π_{j≤i} a_j."""
    total, run = 1.0, 1.0
    for a in accept_cond[:k]:
        run *= a
        total += run
    return total


def conditional_acceptance(accepts: list[int], k_max: int) -> list[float]:
    """Per draft position i = 1..k_max: the share of cycles that accepted i of those that accepted
    i-1 (0 where no cycle got that far)."""
    reached = [sum(a >= i for a in accepts) for i in range(k_max + 1)]  # reached[0] = all cycles
    return [reached[i] / reached[i - 1] if reached[i - 1] else 0.0 for i in range(1, k_max + 1)]


def calibrate(
    engine: Engine,
    make_proposer: Callable[[Shape], Proposer],
    prompts: list[list[int]],
    max_new: int,
    stops: set[int],
    sampling: Callable[[], Sampling],
    shapes: list[Shape],
) -> Calibration:
    """The cycle time and tokens per call of every shape over `prompts` (greedy or sampled as
    `sampling()` says; each call gives a fresh sampler with the run's seed), and plain decoding's
    time per token. Chains: `shapes` are K_max first, whose accepted counts give E(K) for all.
    The shapes and plain decoding take turns a batch of prompts at a time, so that a machine
    whose speed drifts during the calibration (a shared CPU) slows each of them alike."""
    chain = shapes[0].top_k is None
    proposers = [make_proposer(shape) for shape in shapes]
    spec: list[list[Turn]] = [[] for _ in shapes]  # per shape, its turns
    plain: list[Turn] = []
    rows = getattr(engine, "batch", 1)
    for c in range(0, len(prompts), rows):
        part = prompts[c : c + rows]
        for turns, proposer in zip(spec, proposers, strict=True):
            turns += decode_all(engine, part, max_new, stops, sampling(), proposer)
        plain += decode_all(engine, part, max_new, stops, sampling())
    measured = [measured_candidate(shape, turns) for shape, turns in zip(shapes, spec, strict=True)]
    tokens = sum(len(t.tokens) for turns in (spec if not chain else spec[:1]) for t in turns)
    plain_seconds = sum(t.seconds for t in plain) / max(
        sum(len(t.tokens) - 1 for t in plain), 1
    )  # the first token is the prefill's
    if not chain:
        return Calibration("tree", measured, plain_seconds, tokens)
    accept_cond = conditional_acceptance([a for t in spec[0] for a in t.accepts], shapes[0].depth)
    candidates = sorted(  # each chain's tokens per call predicted from K_max's acceptance, its cycle measured
        (replace(c, expected_tokens=expected_tokens(accept_cond, c.shape.depth)) for c in measured),
        key=lambda c: c.shape.depth,
    )
    return Calibration("chain", candidates, plain_seconds, tokens, accept_cond)


def measured_candidate(shape: Shape, turns: list[Turn]) -> Candidate:
    """A shape as its own `turns` measured it: tokens per target call, seconds per cycle and draft
    tokens per call (a row's cycle is its share of its batch's cycle)."""
    accepts = [a for t in turns for a in t.accepts]
    calls = max(len(accepts), 1)
    drafted = sum(d for t in turns for d in t.drafted) / calls
    return Candidate(shape, sum(a + 1 for a in accepts) / calls, sum(t.seconds for t in turns) / calls, drafted)


def adaptive_threshold(cal: Calibration) -> float:
    """`--stop-below auto`'s threshold, from a chain calibration's measured costs. One more draft
    step costs c_step seconds (the slope of the chains' cycle time over their length, least
    squares); a token costs c/E at the best fixed chain. The step pays when the draft it adds is
    accepted with a probability above c_step / (c/E), and the drafter's confidence in its draft
    stands in for that probability. Kept within [0.01, 0.99]."""
    ks = [c.shape.depth for c in cal.candidates]
    ts = [c.cycle_seconds for c in cal.candidates]
    k_mean, t_mean = sum(ks) / len(ks), sum(ts) / len(ts)
    spread_k = sum((k - k_mean) ** 2 for k in ks)
    step = sum((k - k_mean) * (t - t_mean) for k, t in zip(ks, ts, strict=True)) / spread_k if spread_k else 0.0
    best = cal.best()
    return min(max(step * best.expected_tokens / best.cycle_seconds, 0.01), 0.99)


def with_adaptive(cal: Calibration, decode_prompts: Callable[[Shape], list[Turn]]) -> Calibration:
    """A chain calibration with the adaptive chain added: the longest chain calibrated, stopping
    below `adaptive_threshold`, decoded on the calibration's prompts (`decode_prompts(shape)`), its
    tokens per call and cycle time measured (not predicted). A calibration of chains of one draft
    has nothing to stop: as it is."""
    k_max = max(c.shape.depth for c in cal.candidates)
    if k_max < 2:
        return cal
    shape = Shape(k_max, stop_below=round(adaptive_threshold(cal), 4))
    return replace(cal, candidates=[*cal.candidates, measured_candidate(shape, decode_prompts(shape))])


def summary(cal: Calibration) -> str:
    best = cal.best()
    adaptive = any(c.shape.stop_below is not None for c in cal.candidates)
    flag = "--tree" if cal.mode == "tree" else "--stop-below" if adaptive else "--depth"
    table = ", ".join(f"{c.shape.label} {cal.predicted_speedup(c):.2f}x" for c in cal.candidates)
    break_even = cal.break_even(best)
    verdict = (
        ""
        if cal.predicted_speedup(best) > 1
        else (
            f" (no {cal.mode} shape is predicted to beat plain decoding: a {best.shape.label} cycle costs {break_even:.2f} plain "
            f"tokens here, so it pays from tau {break_even:.2f} on, and this drafter's expected tau is {best.expected_tokens:.2f})"
        )
    )
    accept = (
        f"; acceptance per position, given the one before {' '.join(f'{a:.2f}' for a in cal.accept_cond)}"
        if cal.accept_cond
        else ""
    )
    return (
        f"eval: {flag} auto chose {best.shape.label}, predicted speed-up {cal.predicted_speedup(best):.2f}x{verdict}"
        f"{accept}; {table}"
    )
