"""Training throughput of the real trainer, phase by phase (issue 13, item 5).

Each variant builds the trainer exactly as `draftsmith train` does (`train.run.build_trainer`,
into a scratch folder), runs `--warmup` optimizer steps (flex_attention and the loss compile
here), times `--steps` more (tok/s, ms per step, peak GPU memory, the share spent getting rows),
then profiles `--profile-steps` steps and prints where the time goes: the host time of the
trainer's phases (`train.data`: the row read or the target's capture; `train.forward`;
`train.backward`; `train.optimizer`: clip, the finiteness check, the optimizer), the top ops by
host time and the top GPU kernels.

    python bench/train_bench.py runs/h200/prepare --target /root/smollm2-hf \\
        --variant online: --variant adamw:optimizer=adamw --variant rows32k:batch_tokens=32768 \\
        --variant offline:hidden=runs/h200/extract --out-json train_bench.json

Today's GPU defaults (the static-shape, compiled drafter step and flex capture) beside the
dynamic step and dense capture of before 2026-12-02, same rows (the first steps compile: keep
--warmup at 10 or more):

    python bench/train_bench.py runs/h200/prepare --target /root/smollm2-hf \\
        --variant defaults: --variant before:compile_step=false,capture_attention=dense

A variant is NAME:KEY=VALUE,KEY=VALUE,... over `draftsmith train`'s options (values as YAML), plus
`capture=padded` to capture online rows in padded length buckets instead of packed.
Prints one JSON line per variant and writes them all to --out-json.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import platform
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import torch
import yaml

from draftsmith.train.config import TrainConfig
from draftsmith.train.run import build_trainer

PHASES = ("train.data", "train.forward", "train.backward", "train.optimizer")


def parse_variant(text: str) -> tuple[str, dict]:
    name, _, rest = text.partition(":")
    options = {}
    for item in filter(None, rest.split(",")):
        key, _, value = item.partition("=")
        options[key.strip()] = yaml.safe_load(value)
    return name, options


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def phase_table(prof: torch.profiler.profile, steps: int) -> dict[str, float]:
    """Host ms per step of each trainer phase (its `record_function` range). The profiler also
    lists a GPU-side event under the same name, whose span is not the phase's GPU work: only
    the host-side one (the one with host time) is read; the kernels are in the printed tables."""
    out: dict[str, float] = {}
    for event in prof.key_averages():
        if event.key in PHASES and event.cpu_time_total > 0:
            out[event.key] = round(event.cpu_time_total / 1e3 / steps, 2)
    return out


def epoch_groups(trainer, accum: int) -> Iterator[list[list[int]]]:
    """The trainer's accumulation groups, epoch 0, 1, 2, ... (each epoch's last, partial group
    dropped); refuses a dataset too small for one group."""
    for epoch in itertools.count():
        rows = trainer.epoch_rows(epoch)
        if len(rows) < accum:
            raise SystemExit(
                f"train_bench: {len(rows)} rows an epoch, fewer than one step's {accum}: use a larger dataset"
            )
        for at in range(0, len(rows) - accum + 1, accum):
            yield rows[at : at + accum]


def bench_variant(name: str, options: dict, args: argparse.Namespace, scratch: Path) -> dict:
    options = dict(options)
    capture = options.pop("capture", "auto")  # online capture: auto (packed where the model packs) or padded
    cfg = TrainConfig(
        dataset_dir=args.dataset,
        target=args.target,
        out=scratch / name,
        log_every=10**9,
        save_every=10**9,
        val_fraction=0.01,
        **options,
    )
    cfg = cfg.model_copy(update={"steps": args.warmup + args.steps + args.profile_steps + 1})
    trainer = build_trainer(cfg)
    if capture == "padded":
        trainer.source.packed = False
    accum = trainer.cfg.grad_accum
    groups = epoch_groups(trainer, accum)
    ahead = next(groups)

    def run_steps(n: int) -> int:
        """n optimizer steps in the trainer's own order, epoch after epoch as train runs them (a
        small dataset holds fewer groups than the bench's steps), the next group prefetched."""
        nonlocal ahead
        tokens = 0
        for _ in range(n):
            group, ahead = ahead, next(groups)
            trainer.prefetch(ahead)
            tokens += trainer.optimizer_step(group)[1]
        return tokens

    t0 = time.perf_counter()
    run_steps(args.warmup)
    sync()
    warmup_s = time.perf_counter() - t0  # the compiles happen here
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    trainer._data_wait = 0.0
    t0 = time.perf_counter()
    tokens = run_steps(args.steps)
    sync()
    wall = time.perf_counter() - t0
    result = {
        "variant": name,
        "options": options,
        "capture": capture,
        "steps": args.steps,
        "tokens": tokens,
        "tok_per_s": round(tokens / wall, 1),
        "step_ms": round(wall / args.steps * 1e3, 1),
        "warmup_s": round(warmup_s, 1),  # --warmup steps with their compiles: a compile's cost is this less their time
        "data_wait": round(trainer._data_wait / wall, 3),
        "peak_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if torch.cuda.is_available() else None,
    }
    if args.profile_steps:
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        with torch.profiler.profile(activities=activities) as prof:
            run_steps(args.profile_steps)
            sync()
        result["phases"] = phase_table(prof, args.profile_steps)
        keys = ("cpu_time_total", "self_cuda_time_total") if torch.cuda.is_available() else ("cpu_time_total",)
        for key in keys:  # the host's view (phases, syncs, launches), then the GPU's (kernels)
            print(f"--- {name}: top ops by {key} over {args.profile_steps} steps", file=sys.stderr)
            print(
                prof.key_averages().table(sort_by=key, row_limit=40, max_name_column_width=70),
                file=sys.stderr,
                flush=True,
            )
    trainer.log.close()
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dataset", type=Path, help="tokenized dataset folder (draftsmith prepare)")
    ap.add_argument("--target", default="smollm2-135m", help="target spec (alias, .gguf, HF folder)")
    ap.add_argument(
        "--variant", action="append", default=None, help="NAME:KEY=VALUE,... (repeatable; default: train's defaults)"
    )
    ap.add_argument("--steps", type=int, default=30, help="timed optimizer steps per variant")
    ap.add_argument("--warmup", type=int, default=10, help="untimed steps first (compilation happens here)")
    ap.add_argument(
        "--profile-steps", type=int, default=3, help="steps under torch.profiler after the timed ones (0: none)"
    )
    ap.add_argument("--out-json", type=Path, default=None)
    args = ap.parse_args()

    results = []
    with tempfile.TemporaryDirectory(prefix="train-bench-") as tmp:
        for text in args.variant or ["defaults:"]:
            name, options = parse_variant(text)
            r = bench_variant(name, options, args, Path(tmp))
            results.append(r)
            print(json.dumps(r), file=sys.stderr, flush=True)
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    report = {
        "bench": "train",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(sys.argv),
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else platform.processor() or "cpu",
        "torch": torch.__version__,
        "results": results,
    }
    print(json.dumps(report, indent=2))
    if args.out_json:
        args.out_json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
