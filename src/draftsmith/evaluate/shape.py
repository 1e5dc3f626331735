"""`--k auto`: the chain length that maximises the expected decode speed, chosen from a short
calibration on the engine and drafter at hand (before the measured run).

    a_i     conditional acceptance of draft position i (accepted, given 1..i-1 were), from a
            calibration run with the longest chain considered, K_max
    E(K)    = 1 + Σ_{i≤K} Π_{j≤i} a_j          tokens per target call with a chain of K
    c(K)    seconds per draft-and-verify cycle with a chain of K, measured: a calibration run
            per K (its own proposer and, on GPU, its own CUDA graphs), total decode time over
            cycles
    t_plain seconds per token of plain decoding on the same prompt
    predicted speed-up(K) = E(K) / c(K) · t_plain

The calibration prompts are the first turns of the first question(s) of the run; their answers
are not part of the reported figures, which come from the full run at the chosen K.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from draftsmith.evaluate.decode import Proposer, plain_generate, spec_generate
from draftsmith.runtime.sampling import Sampling
from draftsmith.runtime.selfcheck import Engine


@dataclass
class Calibration:
    accept_cond: list[float]  # a_1..a_Kmax
    cycle_seconds: dict[int, float]  # K -> seconds per cycle
    plain_seconds: float  # seconds per plain token
    tokens: int  # calibration tokens decoded at K_max

    def expected_tokens(self, k: int) -> float:
        total, run = 1.0, 1.0
        for a in self.accept_cond[:k]:
            run *= a
            total += run
        return total

    def predicted_speedup(self, k: int) -> float:
        return self.expected_tokens(k) / self.cycle_seconds[k] * self.plain_seconds

    def best(self) -> int:
        return max(self.cycle_seconds, key=self.predicted_speedup)

    def to_dict(self) -> dict[str, Any]:
        k = self.best()
        return {**asdict(self), "cycle_seconds": {str(d): round(s, 6) for d, s in self.cycle_seconds.items()},
                "chosen_k": k, "predicted_speedup": round(self.predicted_speedup(k), 4),
                "candidates": [{"k": d, "expected_tokens": round(self.expected_tokens(d), 4),
                                "cycle_ms": round(1e3 * s, 3), "predicted_speedup": round(self.predicted_speedup(d), 4)}
                               for d, s in sorted(self.cycle_seconds.items())]}


def conditional_acceptance(accepts: list[int], k_max: int) -> list[float]:
    """Per draft position i = 1..k_max: the share of cycles that accepted i of those that accepted
    i-1 (0 where no cycle got that far)."""
    reached = [sum(a >= i for a in accepts) for i in range(k_max + 1)]  # reached[0] = all cycles
    return [reached[i] / reached[i - 1] if reached[i - 1] else 0.0 for i in range(1, k_max + 1)]


def calibrate(engine: Engine, make_proposer: Callable[[int], Proposer], prompts: list[list[int]], max_new: int,
              stops: set[int], sampling: Callable[[], Sampling], k_max: int) -> Calibration:
    """Acceptance at K_max and the cycle time of every K in 1..K_max, over `prompts` (greedy or
    sampled as `sampling()` says; each call gives a fresh sampler with the run's seed)."""
    accepts: list[int] = []
    cycle_seconds: dict[int, float] = {}
    tokens = 0
    for k in range(k_max, 0, -1):
        proposer = make_proposer(k)
        seconds, cycles = 0.0, 0
        for prompt in prompts:
            turn = spec_generate(engine, proposer, prompt, max_new, stops, sampling())
            seconds, cycles = seconds + turn.seconds, cycles + len(turn.accepts)
            if k == k_max:
                accepts += turn.accepts
                tokens += len(turn.tokens)
        cycle_seconds[k] = seconds / max(cycles, 1)
    plain = [plain_generate(engine, p, max_new, stops, sampling()) for p in prompts]
    plain_seconds = sum(t.seconds for t in plain) / max(sum(len(t.tokens) - 1 for t in plain), 1)  # the first token is the prefill's
    return Calibration(conditional_acceptance(accepts, k_max), cycle_seconds, plain_seconds, tokens)


def summary(cal: Calibration) -> str:
    k = cal.best()
    table = ", ".join(f"K={c['k']} {c['predicted_speedup']:.2f}x" for c in cal.to_dict()["candidates"])
    verdict = "" if cal.predicted_speedup(k) > 1 else " (no chain length is predicted to beat plain decoding)"
    return (f"eval: --k auto chose K={k}, predicted speed-up {cal.predicted_speedup(k):.2f}x{verdict}; "
            f"acceptance per position {' '.join(f'{a:.2f}' for a in cal.accept_cond)}; {table}")
