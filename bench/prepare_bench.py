"""Throughput of `draftsmith prepare` (samples/s), pinned to a fixed number of CPU cores.

Runs the real `prepare` (read, render the chat template, tokenize with loss masks, write the
dataset) on GSM8K as prompt/response pairs, `--repeats` times, and prints one JSON object:
the tokenizing rate that `prepare` records in stats.json, the end-to-end wall time of the
command (including the tokenizer load), and the process CPU time, per repeat and best/median.

    python bench/prepare_bench.py --cores 2 --out-json prepare_bench.json
    python bench/prepare_bench.py --smoke                      # 500 rows, one repeat
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def pin_cores(n: int) -> list[int]:
    """Restrict this process (and the tokenizer's Rust thread pool) to `n` cores."""
    cores = sorted(os.sched_getaffinity(0))[:n]
    os.sched_setaffinity(0, cores)
    os.environ["RAYON_NUM_THREADS"] = str(len(cores))  # read when tokenizers starts its pool
    return cores


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=REPO / "src/draftsmith/assets/gsm8k_train.jsonl")
    ap.add_argument(
        "--target", default="smollm2-135m", help="alias, .gguf file or HF folder (only the tokenizer is loaded)"
    )
    ap.add_argument("--cores", type=int, default=2, help="CPU cores to pin to (0 = all)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-len", type=int, default=2048)
    ap.add_argument("--smoke", action="store_true", help="500 rows, one repeat: checks the script works")
    ap.add_argument("--out-json", type=Path)
    args = ap.parse_args()

    cores = pin_cores(args.cores) if args.cores else sorted(os.sched_getaffinity(0))
    from draftsmith.data.config import PrepareConfig
    from draftsmith.data.prepare import run

    work = Path(tempfile.mkdtemp(prefix="prepare_bench."))
    data = args.data
    if args.smoke:
        data = work / "smoke.jsonl"
        data.write_text("".join(args.data.read_text().splitlines(keepends=True)[:500]))
        args.repeats = 1
    runs = []
    for i in range(args.repeats):
        cfg = PrepareConfig(
            data=data, target=args.target, out=work / "ds", format="pairs", max_len=args.max_len, overwrite=True
        )
        wall, cpu = time.perf_counter(), time.process_time()
        with contextlib.redirect_stdout(sys.stderr):  # keep stdout for the JSON
            run(cfg)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        stats = json.loads((work / "ds" / "stats.json").read_text())
        runs.append(
            {
                "samples": stats["samples_in"],
                "tokens": stats["tokens"],
                "samples_per_s": round(stats["throughput"]["samples_per_s"], 1),
                "tokens_per_s": round(stats["throughput"]["tokens_per_s"]),
                "tokenize_seconds": stats["throughput"]["tokenize_seconds"],
                # contention-proof: samples per CPU-second of the tokenizing phase (all threads)
                "samples_per_cpu_s": round(
                    stats["samples_in"] / max(stats["throughput"]["tokenize_cpu_seconds"], 1e-9), 1
                ),
                "wall_seconds_end_to_end": round(wall, 3),
                "cpu_seconds_end_to_end": round(cpu, 3),
            }
        )
        print(f"repeat {i}: {runs[-1]}", file=sys.stderr)
    rates = [r["samples_per_s"] for r in runs]
    result = {
        "bench": "prepare",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "host": platform.node(),
        "cpu": platform.processor() or platform.machine(),
        "cores": cores,
        "load_avg_1m": os.getloadavg()[0],
        "data": str(args.data),
        "target": args.target,
        "smoke": args.smoke,
        "samples_per_s_best": max(rates),
        "samples_per_s_median": statistics.median(rates),
        "bar_samples_per_s": 2000,
        "meets_bar": statistics.median(rates) >= 2000,
        "runs": runs,
    }
    print(json.dumps(result, indent=2))
    if args.out_json:
        args.out_json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
