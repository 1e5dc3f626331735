"""The ablation table of experiments/LOG.md from a run folder of experiments/recipes/ablation_h200.yaml.

For every train stage: its options (from run.yaml), the final validation record (acc_0,
cond_acc per step, simulated τ and, since 5a37c46, the walked τ), training tokens, wall time and tok/s (progress.json), peak GPU
memory and data_wait (the last progress gauges), τ gained per GPU-minute, and the MT-bench
chain τ of any eval stage that read its drafter.

    python experiments/summarise_ablation.py /root/runs/h200 --out results/ablation.md
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import yaml

from draftsmith.train.metrics import read_metrics

KNOBS = (
    "batch_tokens",
    "steps",
    "lr",
    "optimizer",
    "schedule",
    "warmup_ratio",
    "step_decay",
    "norm_before_fc",
    "fc_norm",
    "norm_output",
    "head_init",
    "freeze_head",
    "aux_noise",
    "weight_decay",
    "loss_tokens",
    "aux_layer_ids",
    "intermediate_size",
    "num_layers",
    "ttt_positions",
    "teacher_temperature",
    "seed",
    "compile_step",
    "capture_attention",
)


def train_row(folder: Path) -> dict | None:
    val = [r for r in read_metrics(folder) if r["split"] == "val"] if (folder / "metrics.jsonl").exists() else []
    if not val:
        return None
    cfg = yaml.safe_load((folder / "run.yaml").read_text())["config"]
    progress = json.loads((folder / "progress.json").read_text())
    last = val[-1]
    minutes = progress["elapsed_s"] / 60
    return {
        "name": folder.name,
        **{k: cfg.get(k) for k in KNOBS},
        "tokens": progress["tokens"],
        "minutes": round(minutes, 2),
        "tok_per_s": progress["tok_per_s"],
        "acc_0": round(last["acc_0"], 3),
        "cond_acc_k": [round(c, 2) for c in last["cond_acc_k"]],
        "val_tau": round(last["tau"], 3),
        "val_tau_walk": round(last["tau_walk"], 3) if "tau_walk" in last else None,
        "best_val_tau": round(max(r["tau"] for r in val), 3),
        "tau_gain_per_gpu_min": round((last["tau"] - 1) / max(minutes, 1e-9), 3),
        "gpu_mem_gb": progress["counters"].get("gpu_mem_gb"),
        "data_wait": progress["counters"].get("data_wait"),
        "val_curve": [(r["step"], r.get("tokens"), round(r["tau"], 3)) for r in val],
    }


def eval_taus(root: Path) -> dict[str, dict]:
    """{train stage name: {eval name: report}} for the eval stages under root."""
    out: dict[str, dict] = {}
    for report in sorted(root.glob("*/report.json")):
        r = json.loads(report.read_text())
        cfg = yaml.safe_load((report.parent / "run.yaml").read_text())["config"]
        trained = (
            Path(cfg["drafter"]).parent.name if Path(cfg["drafter"]).name == "drafter" else Path(cfg["drafter"]).name
        )
        out.setdefault(trained, {})[report.parent.name] = r
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("root", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    evals = eval_taus(args.root)
    rows = [r for f in sorted(args.root.iterdir()) if f.is_dir() and (r := train_row(f))]
    lines = [
        "| stage | rows × steps | lr | opt | sched | options | val acc_0 | val cond_acc per step | val τ | MT-bench chain τ | "
        "min | tok/s | τ-1 per GPU-min | peak GiB | data_wait |",
        "|" + "---|" * 15,
    ]
    for r in rows:
        opts = [k for k in ("norm_before_fc", "fc_norm", "norm_output", "freeze_head") if r[k]]
        if r["head_init"] == "target":
            opts.append("head from target")
        if r["step_decay"] != 0.8:
            opts.append(f"step_decay {r['step_decay']}")
        opts += [f"{k} {r[k]:g}" for k in ("aux_noise", "weight_decay") if r[k]]
        if r["loss_tokens"] not in (None, "answers"):
            opts.append(f"loss on {r['loss_tokens']} tokens")
        if r["aux_layer_ids"]:
            opts.append(f"aux layers {r['aux_layer_ids']}")
        if r["intermediate_size"]:
            opts.append(f"MLP width {r['intermediate_size']}")
        if (r["num_layers"] or 1) > 1:
            opts.append(f"{r['num_layers']} decoder layers")
        if r["ttt_positions"] not in (None, "all"):
            opts.append(f"TTT positions {r['ttt_positions']}")
        if r["teacher_temperature"] not in (None, 1.0):
            opts.append(f"teacher temperature {r['teacher_temperature']:g}")
        if r["seed"]:
            opts.append(f"seed {r['seed']}")
        walked = f" (walked {r['val_tau_walk']})" if r["val_tau_walk"] else ""
        chain = [
            e["tau"] for e in evals.get(r["name"], {}).values() if e.get("mode") == "chain" and not e.get("temperature")
        ]
        lines.append(
            f"| {r['name']} | {r['batch_tokens']} × {r['steps']} | {r['lr']:g} | {r['optimizer']} | {r['schedule']} "
            f"| {', '.join(opts) or '-'} | {r['acc_0']} | {' '.join(f'{c:.2f}' for c in r['cond_acc_k'])} "
            f"| **{r['val_tau']}**{walked} | {f'{chain[0]:.2f}' if chain else '-'} | {r['minutes']} | {r['tok_per_s']:.0f} "
            f"| {r['tau_gain_per_gpu_min']} | {r['gpu_mem_gb']} | {r['data_wait']} |"
        )
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(
        json.dumps(
            {
                "rows": rows,
                "evals": {
                    k: {
                        n: {f: e.get(f) for f in ("tau", "speedup", "accept_per_position", "mode")}
                        for n, e in v.items()
                    }
                    for k, v in evals.items()
                },
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
