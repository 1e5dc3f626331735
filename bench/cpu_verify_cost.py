"""What verifying T tokens costs against decoding one, on this CPU: why a drafter's speed-up on a
CPU depends on the machine as much as on its tau.

A chain cycle of K draft tokens runs the target once on K + 1 tokens. On a GPU that costs about
what one token costs (memory-bound either way). On a CPU it costs what the BLAS's small-M matrix
products cost: this prints the fast engine's forward (the embedded default, fp32, eager, as
`eval` runs it on CPU) at T = 1..4 tokens, and each of the model's weight shapes through
F.linear at M = 1, 2, 4 rows, as multiples of T = 1 / M = 1. A cycle pays from tau = its cost in
plain tokens (eval's `--depth auto` measures the same on real answers and says so).

    python bench/cpu_verify_cost.py [--target smollm2-135m] [--repeats 20]
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from draftsmith.runtime.engine import TargetEngine
from draftsmith.target import load_target


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def seconds(fn, repeats: int) -> float:
    fn()  # warm-up
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - t0) / repeats


@torch.no_grad()
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()
    target = load_target(args.target, "cpu", "fp32")
    slots = 256
    engine = TargetEngine(target.model, [], slots)
    forward: dict[int, float] = {}
    for t in (1, 2, 3, 4):  # t tokens at positions 100.., seeing the 100 before them
        ids, pos = torch.randint(0, 1000, (1, t)), torch.arange(100, 100 + t)[None]
        mask = torch.zeros(1, t, slots, dtype=torch.bool)
        mask[..., : 100 + t] = True
        forward[t] = seconds(lambda: engine.forward_batch(ids, pos, pos, mask), args.repeats)
    shapes = sorted({tuple(m.weight.shape) for m in target.model.modules() if isinstance(m, torch.nn.Linear)})
    linear: dict[str, dict[int, float]] = {}
    for out_f, in_f in shapes:
        w = torch.randn(out_f, in_f)
        reps = max(args.repeats, 10**9 // (out_f * in_f))  # small shapes: more repeats, less noise
        rows = {m: torch.randn(m, in_f) for m in (1, 2, 4)}  # made outside the timed calls
        linear[f"{out_f}x{in_f}"] = {m: seconds(lambda x=x: F.linear(x, w), reps) for m, x in rows.items()}
    result = {
        "cpu": cpu_name(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "target": args.target,
        "forward_ms": {t: round(s * 1e3, 2) for t, s in forward.items()},
        "forward_vs_one_token": {t: round(s / forward[1], 2) for t, s in forward.items()},
        "linear_vs_one_row": {k: {m: round(s / v[1], 2) for m, s in v.items()} for k, v in linear.items()},
        "linear_one_row_us": {k: round(v[1] * 1e6, 1) for k, v in linear.items()},
    }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
