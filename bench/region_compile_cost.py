"""What compiling a draft as one region costs against compiling the drafter step alone (issue 15).

For each variant (the step compiled alone, then the whole draft as one region: `DrafterProposer`'s
`draft_region`), on the embedded default with a random drafter: the first `propose()` (where
inductor compiles) and the median of later ones, without CUDA graphs, so that the figures are
the compiled code's own. On CPU this is inductor's C++ backend, which `eval` does not use by
default (`--compile-drafter` is on for GPU only): a proxy of the compile's size there.

    python bench/region_compile_cost.py --mode tree --depth 7 --top-k 10 --total-tokens 60
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from draftsmith.evaluate.proposer import DrafterProposer
from draftsmith.runtime.engine import TargetEngine
from draftsmith.runtime.sampling import Sampling
from draftsmith.target import load_target

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: the tests' untrained drafter
from tests.helpers import random_drafter


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--mode", choices=["chain", "tree"], default="tree")
    ap.add_argument("--depth", type=int, default=7)
    ap.add_argument("--top-k", type=int, default=10)
    ap.add_argument("--total-tokens", type=int, default=60)
    ap.add_argument("--reps", type=int, default=10)
    args = ap.parse_args()
    target = load_target(args.target)
    drafter = random_drafter(target.model, 32000).to(dtype=target.dtype)
    engine = TargetEngine(target.model, drafter.config.aux_layer_ids, max_len=256)
    prompt = target.tokenizer.encode("Explain why the sky is blue.")
    result = {
        "device": str(next(target.model.parameters()).device),
        "torch": torch.__version__,
        "shape": {k: getattr(args, k) for k in ("mode", "depth", "top_k", "total_tokens")},
    }
    for name in ("step", "region"):
        torch._dynamo.reset()
        prop = DrafterProposer(
            drafter,
            Sampling(),
            256,
            mode=args.mode,
            depth=args.depth,
            top_k=args.top_k,
            total_tokens=args.total_tokens,
            compile=True,
        )
        if name == "step":
            prop.draft_region = None
        _, aux, ids, pad = engine.prefill_rows([prompt])
        prop.observe_prompt(aux, torch.cat([ids[:, 1:], ids[:, -1:]], dim=1), pad)
        t0 = time.perf_counter()
        prop.propose()
        first = time.perf_counter() - t0
        times = []
        for _ in range(args.reps):
            t0 = time.perf_counter()
            prop.propose()
            times.append(time.perf_counter() - t0)
        result[name] = {"first_propose_s": round(first, 1), "draft_ms": round(1000 * statistics.median(times), 2)}
        print(name, result[name], flush=True)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
