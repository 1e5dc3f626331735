"""2-GPU data-parallel training against one GPU at the same global batch (issue 5, must-show 6).

Runs `draftsmith train` twice on the same data and seed, offline (a store from `extract`):

  one   one process, --grad-accum 2        (two micro-batches per optimizer step)
  ddp   torchrun --nproc-per-node 2, DDP   (one micro-batch per rank per step)

Both see the same rows in the same order per step, so their loss curves must match (bf16
autocast on GPU: within a small tolerance, not bitwise). The scale-up is the steady-state
training tok/s of `ddp` over `one`, from the metrics logs, leaving out the first logged
interval (flex_attention compiles there).

    python bench/ddp_bench.py --dataset runs/h200/prepare --hidden runs/h200/extract \
        --target /root/smollm2-hf --steps 60 --out-json bench_ddp.json

Prints one JSON object and writes it to --out-json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import time
from pathlib import Path

from draftsmith.train.metrics import read_metrics


def train(cmd: list[str], out: Path, args: argparse.Namespace, grad_accum: int) -> dict:
    full = [
        *cmd,
        "train",
        str(args.dataset),
        "--hidden",
        str(args.hidden),
        "--target",
        args.target,
        "--out",
        str(out),
        "--steps",
        str(args.steps),
        "--grad-accum",
        str(grad_accum),
        "--batch-tokens",
        str(args.batch_tokens),
        "--lr",
        "3e-4",
        "--val-fraction",
        "0",
        "--val-every",
        str(10 * args.steps),
        "--log-every",
        str(args.log_every),
        "--save-every",
        str(10 * args.steps),
        "--seed",
        "0",
        "--overwrite",
    ]
    t0 = time.perf_counter()
    subprocess.run(full, check=True)
    records = [r for r in read_metrics(out) if r["split"] == "train"]
    # elapsed time at each record from its cumulative rate; steady state = after the first record
    first, last = records[0], records[-1]
    t_first, t_last = first["tokens"] / first["tok_per_s"], last["tokens"] / last["tok_per_s"]
    return {
        "command": " ".join(full),
        "wall_s": round(time.perf_counter() - t0, 1),
        "loss": [round(r["loss"], 5) for r in records],
        "acc_0": [round(r["acc_0"], 4) for r in records],
        "steady_tok_per_s": round((last["tokens"] - first["tokens"]) / (t_last - t_first), 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", type=Path, required=True)
    ap.add_argument("--hidden", type=Path, required=True)
    ap.add_argument("--target", required=True)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--log-every", type=int, default=5)
    ap.add_argument("--batch-tokens", type=int, default=32768)
    ap.add_argument("--work-dir", type=Path, default=Path("bench_ddp_work"))
    ap.add_argument("--rtol", type=float, default=0.02, help="allowed relative loss difference per logged step")
    ap.add_argument("--out-json", type=Path, default=Path("bench_ddp.json"))
    args = ap.parse_args()

    one = train([sys.executable, "-m", "draftsmith"], args.work_dir / "one", args, grad_accum=2)
    ddp = train(["torchrun", "--nproc-per-node", "2", "-m", "draftsmith"], args.work_dir / "ddp", args, grad_accum=1)
    rel = [abs(a - b) / abs(a) for a, b in zip(one["loss"], ddp["loss"], strict=True)]
    report = {
        "bench": "ddp",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(sys.argv),
        "one_gpu_grad_accum_2": one,
        "two_gpu_ddp": ddp,
        "max_relative_loss_diff": round(max(rel), 5),
        "loss_match": max(rel) <= args.rtol,
        "scale_up": round(ddp["steady_tok_per_s"] / one["steady_tok_per_s"], 3),
    }
    print(json.dumps(report, indent=2))
    args.out_json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
