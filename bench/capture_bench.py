"""Online training's capture, dense against flex attention (issue 13, item 5), and flex compiled
(`--compile-capture`): the target's packed forward over training rows, as `OnlineSource` runs it
(`--capture-attention`).

The target is a Llama of the embedded default's shape (SmolLM2-135M: 30 layers, hidden 576, 9
heads, 3 KV heads, MLP 1,536, vocab 49,152) with random weights, or `--target`: the capture's
cost does not depend on the weights, so the bench needs no model files. Rows are `--row-tokens`
of samples whose lengths are drawn from a gamma distribution of mean `--mean-length` (the H200
recipe's prepared data: mean 315, longest 1,070), packed into rows as training packs them
(`pack_rows`).
Each variant captures `--warmup` rows (flex compiles here), then times `--rows` rows (the host
packing, the forward, the split into samples) and reports ms per row, tok/s and peak memory;
the first timed row's states are compared between variants (the largest difference relative to
the largest state). On CUDA each variant also reports where a row's time goes: `host_ms_per_row`,
the host's time to issue a row (its capture without waiting for the GPU), and
`gpu_busy_ms_per_row`, the sum of its kernels' times (torch.profiler); a row whose wall time is
near its host time and far above its kernels' is bound by the launches, not by the GPU.

    python bench/capture_bench.py --out-json capture_bench.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

from draftsmith.target import load_target
from draftsmith.train.batching import OnlineSource, pack_rows

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: the tests' model helpers
from tests.helpers import smollm2_shaped

VARIANTS = {"dense": (None, False), "flex": ("flex_attention", False), "flex-compiled": ("flex_attention", True)}


class Rows:
    """A tokenized dataset as OnlineSource reads it: `lengths` and `[i]` -> input_ids, loss_mask."""

    def __init__(self, lengths: np.ndarray, vocab: int, seed: int) -> None:
        g = np.random.default_rng(seed)
        self.lengths = lengths
        self.ids = [torch.from_numpy(g.integers(3, vocab, size=int(n))) for n in lengths]

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "loss_mask": torch.ones_like(self.ids[i])}


def issue_and_kernel_ms(source: OnlineSource, rows: list[list[int]]) -> tuple[float, float]:
    """(host ms a row to issue its capture, GPU kernel ms a row) over `rows`, after a sync."""
    torch.cuda.synchronize()
    host = 0.0
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for row in rows:
            t0 = time.perf_counter()
            source.samples(row)
            host += time.perf_counter() - t0
        torch.cuda.synchronize()
    kernels_us = sum(e.self_device_time_total for e in prof.key_averages())
    return round(host / len(rows) * 1e3, 2), round(kernels_us / len(rows) / 1e3, 2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--target", default=None, help="target spec; default: a random Llama of the embedded default's shape"
    )
    ap.add_argument("--rows", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--row-tokens", type=int, default=8192)
    ap.add_argument("--mean-length", type=float, default=315.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out-json", type=Path, default=None)
    args = ap.parse_args()

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    if args.target:
        model = load_target(args.target, device, "auto").model
    else:
        model = smollm2_shaped(args.seed, attn_implementation="sdpa").to(device, dtype).requires_grad_(False)
    vocab = int(model.get_input_embeddings().weight.shape[0])
    g = np.random.default_rng(args.seed)
    n = int((args.rows + args.warmup + 2) * args.row_tokens / args.mean_length * 1.2)
    lengths = np.clip(g.gamma(2.0, args.mean_length / 2.0, size=n), 16, 2048).astype(int)
    data = Rows(lengths, vocab, args.seed)
    rows = pack_rows(lengths, list(range(len(lengths))), args.row_tokens, seed=None)[: args.warmup + args.rows]
    aux_ids = [2, len(model.model.layers) // 2, len(model.model.layers) - 3]

    results, first = [], {}
    for name, (attention, compiled) in VARIANTS.items():
        source = OnlineSource(
            data, model, aux_ids, max_len=2048, token_budget=args.row_tokens, attention=attention, compile=compiled
        )
        for row in rows[: args.warmup]:
            source.samples(row)
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        tokens, t0 = 0, time.perf_counter()
        for j, row in enumerate(rows[args.warmup :]):
            out = source.samples(row)
            tokens += sum(len(s["input_ids"]) for s in out)
            if j == 0:
                first[name] = torch.cat([s["final"] for s in out]).float()  # [tokens, H]
        if device.type == "cuda":
            torch.cuda.synchronize()
        wall = time.perf_counter() - t0
        if device.type == "cuda":
            host_ms, busy_ms = issue_and_kernel_ms(source, rows[args.warmup :])
        r = {
            "variant": name,
            "packed": source.packed,
            "rows": args.rows,
            "tokens": tokens,
            "ms_per_row": round(wall / args.rows * 1e3, 2),
            "tok_per_s": round(tokens / wall, 1),
            "peak_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if device.type == "cuda" else None,
        }
        if device.type == "cuda":
            r |= {"host_ms_per_row": host_ms, "gpu_busy_ms_per_row": busy_ms}
        results.append(r)
        print(json.dumps(r), file=sys.stderr, flush=True)
    ref = first["dense"]
    diff = {name: round(float((x - ref).abs().max() / ref.abs().max()), 5) for name, x in first.items()}
    report = {
        "bench": "capture",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(sys.argv),
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "dtype": str(dtype),
        "results": results,
        "final_state_max_rel_diff_vs_dense": diff,
        "speedup_flex_vs_dense": round(results[0]["ms_per_row"] / results[1]["ms_per_row"], 2),
        "speedup_compiled_vs_flex": round(results[1]["ms_per_row"] / results[2]["ms_per_row"], 2),
    }
    print(json.dumps(report, indent=2))
    if args.out_json:
        args.out_json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
