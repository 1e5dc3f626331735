"""Benchmark of `draftsmith extract` against its two ceilings, measured in the same run.

For N random-token samples of about L tokens (ids drawn from the target's vocab):
  (a) extraction tok/s to disk through the real `extract` code path (`draftsmith.extract.run.run`),
      from its own progress record (target loading excluded, final drain included);
  (b) forward-only tok/s: the same length-bucketed batches, capture and row gather, no writes;
  (c) the disk's sequential write bandwidth: `dd if=/dev/zero of=FILE bs=1M count=M oflag=direct`
      in the store's folder.
Reports bytes per token on disk against the ideal (n_aux+1)·H·dtype_size and the ratio
extraction / min(forward-only, disk-bound tok/s), where disk-bound = dd bytes/s / bytes per token.
The bar is a ratio >= 0.8.

    python bench/extract_bench.py --target /root/m/SmolLM2-135M-Instruct.Q4_1.gguf --out-json bench_extract.json
    python bench/extract_bench.py --smoke      # CPU, seconds: checks the script works
    python bench/extract_bench.py --compare STORE_A STORE_B   # e.g. a 1-GPU and a 2-GPU store: same content?

Prints one JSON object and writes it to --out-json.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

from draftsmith.data.dataset import FORMAT, META_FILE, pad_batch, write_table
from draftsmith.data.store import StoreReader, length_batches
from draftsmith.extract.config import ExtractConfig
from draftsmith.extract.run import gather_rows
from draftsmith.extract.run import run as extract
from draftsmith.progress import PROGRESS_FILE
from draftsmith.runtime.capture import capture
from draftsmith.target import load_target


def make_dataset(path: Path, n: int, length: int, vocab: int, seed: int = 0) -> None:
    """n samples of length ±25% around `length`, random ids in [0, vocab)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(max(1, int(length * 0.75)), int(length * 1.25) + 1, size=n)
    samples = [rng.integers(0, vocab, size=int(t), dtype=np.int64).tolist() for t in lengths]
    path.mkdir(parents=True, exist_ok=True)
    write_table(
        path,
        {
            "sample_id": list(range(n)),
            "input_ids": samples,
            "loss_mask": [[1] * len(s) for s in samples],
            "length": [len(s) for s in samples],
        },
    )
    (path / META_FILE).write_text(
        json.dumps({"format": FORMAT, "version": 1, "target": {}, "max_len": int(lengths.max())})
    )


def forward_only(target, ds, layers: list[int], token_budget: int) -> dict:
    """tok/s of capture + gather over the same batches `extract` makes, nothing copied out."""
    from draftsmith.data.dataset import load_dataset

    data = load_dataset(ds)
    rows = list(range(len(data)))
    batches = length_batches(data.lengths, token_budget, shuffle=True, seed=0)
    sync = torch.cuda.synchronize if target.device.type == "cuda" else (lambda: None)
    ids, mask, lengths = pad_batch(data, batches[0], target.device)  # warm-up
    capture(target.model, ids, mask, layers)
    sync()
    t0, tokens = time.perf_counter(), 0
    for batch in batches:
        ids, mask, lengths = pad_batch(data, [rows[j] for j in batch], target.device)  # [B, T_max]
        aux, final = capture(target.model, ids, mask, layers)  # [B, T_max, n_aux*H], [B, T_max, H]
        aux_rows, final_rows = gather_rows(aux, lengths), gather_rows(final, lengths)  # [N, ...]
        torch.isfinite(aux_rows).all(-1) & torch.isfinite(final_rows).all(-1)
        tokens += sum(lengths)
    sync()
    seconds = time.perf_counter() - t0
    return {"tokens": tokens, "seconds": round(seconds, 3), "tok_per_s": round(tokens / seconds, 1)}


def dd_bandwidth(folder: Path, megabytes: int) -> dict:
    """Sequential direct-I/O write bandwidth of the filesystem holding `folder`, in bytes/s."""
    f = folder / "dd-bench.bin"
    cmd = ["dd", "if=/dev/zero", f"of={f}", "bs=1M", f"count={megabytes}", "oflag=direct"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    f.unlink(missing_ok=True)
    if proc.returncode != 0:
        return {"error": proc.stderr.strip(), "bytes_per_s": None}
    m = re.search(r"copied, ([0-9.eE+-]+) s", proc.stderr)
    seconds = float(m.group(1)) if m else wall
    return {
        "bytes": megabytes << 20,
        "seconds": round(seconds, 3),
        "bytes_per_s": (megabytes << 20) / seconds,
        "dd": proc.stderr.strip().splitlines()[-1],
    }


def compare_stores(a: Path, b: Path) -> dict:
    """Sample by sample: same ids, same tokens and masks, and how close the hidden states are."""
    ra, rb = StoreReader(a), StoreReader(b)
    out = {
        "bench": "extract-compare",
        "a": str(a),
        "b": str(b),
        "samples_a": len(ra),
        "samples_b": len(rb),
        "same_sample_ids": ra.sample_ids == rb.sample_ids,
        "same_aux_layer_ids_dtype_target": [ra.meta[k] for k in ("aux_layer_ids", "dtype")]
        + [ra.meta["target"]["fingerprint"]]
        == [rb.meta[k] for k in ("aux_layer_ids", "dtype")] + [rb.meta["target"]["fingerprint"]],
    }
    bitwise, worst, tokens_equal = 0, 0.0, True
    for sid in sorted(set(ra.sample_ids) & set(rb.sample_ids)):
        x, y = ra.get(sid), rb.get(sid)
        tokens_equal &= torch.equal(x["input_ids"], y["input_ids"]) and torch.equal(x["loss_mask"], y["loss_mask"])
        same = True
        for key in ("aux_hidden_states", "final_hidden_states"):
            same &= torch.equal(x[key], y[key])
            diff = (x[key].float() - y[key].float()).norm() / y[key].float().norm().clamp_min(1e-12)
            worst = max(worst, float(diff))
        bitwise += int(same)
    out.update(
        {
            "tokens_and_masks_equal": tokens_equal,
            "bitwise_identical_samples": bitwise,
            "max_relative_error": worst,
            "identical_content": out["same_sample_ids"] and tokens_equal and worst < 5e-2,
        }
    )
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default="smollm2-135m")
    p.add_argument("--samples", type=int, default=2000)
    p.add_argument("--length", type=int, default=1024)
    p.add_argument("--token-budget", type=int, default=65536)
    p.add_argument("--writers", type=int, default=8)
    p.add_argument("--dd-mb", type=int, default=4096)
    p.add_argument("--work-dir", type=Path, default=Path("bench_extract_work"))
    p.add_argument("--staging-dir", type=Path, default=None)
    p.add_argument("--device", default=None)
    p.add_argument("--keep", action="store_true", help="keep the store after the run")
    p.add_argument("--smoke", action="store_true", help="tiny sizes on CPU, to check the script")
    p.add_argument("--out-json", type=Path, default=Path("bench_extract.json"))
    p.add_argument("--compare", nargs=2, type=Path, metavar=("STORE_A", "STORE_B"), help="only compare two stores")
    args = p.parse_args()
    if args.compare:
        result = compare_stores(*args.compare)
        args.out_json.write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps(result, indent=2))
        return
    if args.smoke:
        args.samples, args.length, args.token_budget, args.dd_mb = 24, 48, 512, 16
        args.device = args.device or "cpu"

    work = args.work_dir.absolute()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    target = load_target(args.target, args.device)
    layers = target.info.default_aux_layers
    make_dataset(work / "ds", args.samples, args.length, target.info.vocab_size)

    fwd = forward_only(target, work / "ds", layers, args.token_budget)
    device = str(target.device)
    del target
    if device.startswith("cuda"):
        torch.cuda.empty_cache()

    store = work / "store"
    cfg = ExtractConfig(
        dataset_dir=work / "ds",
        target=args.target,
        out=store,
        device=device,
        token_budget=args.token_budget,
        writers=args.writers,
        staging_dir=args.staging_dir,
        force=True,
    )
    extract(cfg)
    prog = json.loads((store / PROGRESS_FILE).read_text())
    reader = StoreReader(store)
    meta = reader.meta
    tokens, disk_bytes = meta["totals"]["tokens"], meta["totals"]["bytes"]
    dtype_size = torch.empty((), dtype=getattr(torch, meta["dtype"])).element_size()
    ideal = (meta["n_aux"] + 1) * meta["hidden_size"] * dtype_size
    bytes_per_token = disk_bytes / tokens
    ext_tps = prog["tokens"] / prog["elapsed_s"]

    dd = dd_bandwidth(work, args.dd_mb)
    disk_tps = dd["bytes_per_s"] / bytes_per_token if dd["bytes_per_s"] else None
    bound = min(fwd["tok_per_s"], disk_tps) if disk_tps else fwd["tok_per_s"]
    result = {
        "bench": "extract",
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "device": torch.cuda.get_device_name() if device.startswith("cuda") else "cpu",
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "target": args.target,
        "aux_layer_ids": meta["aux_layer_ids"],
        "dtype": meta["dtype"],
        "samples": len(reader),
        "tokens": tokens,
        "token_budget": args.token_budget,
        "writers": args.writers,
        "staging_dir": str(args.staging_dir) if args.staging_dir else None,
        "extract_tok_per_s": round(ext_tps, 1),
        "extract_seconds": prog["elapsed_s"],
        "extract_errors": prog["errors"],
        "forward_only_tok_per_s": fwd["tok_per_s"],
        "disk_write_bytes_per_s": round(dd["bytes_per_s"]) if dd["bytes_per_s"] else None,
        "dd": dd.get("dd") or dd.get("error"),
        "disk_bound_tok_per_s": round(disk_tps, 1) if disk_tps else None,
        "bytes_per_token": round(bytes_per_token, 1),
        "ideal_bytes_per_token": ideal,
        "overhead_vs_ideal": round(bytes_per_token / ideal - 1, 4),
        "ratio_vs_bound": round(ext_tps / bound, 3),
        "bar": 0.8,
        "pass": ext_tps / bound >= 0.8,
    }
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    args.out_json.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
