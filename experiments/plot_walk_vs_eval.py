"""Acceptance per draft position: what validation predicts against what eval measures (issue 17).

    python experiments/plot_walk_vs_eval.py runs/h200/train_online \\
        "held-out=runs/h200/eval_held_out" "MT-bench=runs/h200/eval_chain" \\
        --out docs/figures/h200_walk_vs_eval.png

Plots, at each position k of a chain, the share of cycles whose first k drafts were accepted:
for the training run's last validation, simulated (a chain started at every answer position,
`Π_{j≤k} cond_acc_j`) and walked (cycles laid end to end as decoding lays them, `walk_accept_k`);
for each eval report (LABEL=FOLDER, a `draftsmith eval` output), its measured
`accept_per_position`. Each line's label carries its τ (1 + the line's sum). Prints the points.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from draftsmith.train.metrics import read_metrics


def validation_lines(train_dir: Path) -> dict[str, list[float]]:
    """The last validation record's simulated and walked acceptance per position."""
    val = [r for r in read_metrics(train_dir) if r["split"] == "val"]
    if not val:
        raise SystemExit(f"{train_dir}: metrics.jsonl has no validation record")
    last = val[-1]
    simulated = [math.prod(last["cond_acc_k"][: k + 1]) for k in range(len(last["cond_acc_k"]))]
    lines = {"validation, simulated": simulated}
    if "walk_accept_k" in last:
        lines["validation, walked"] = last["walk_accept_k"]
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("train_dir", type=Path, help="a draftsmith train output folder (metrics.jsonl)")
    ap.add_argument("evals", nargs="*", help="LABEL=FOLDER of a draftsmith eval output (report.json)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()

    lines = validation_lines(args.train_dir)
    for spec in args.evals:
        label, _, folder = spec.partition("=")
        if not folder:
            raise SystemExit(f"{spec!r}: give LABEL=FOLDER")
        lines[f"{label}, measured"] = json.loads((Path(folder) / "report.json").read_text())["accept_per_position"]

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for label, accept in lines.items():
        tau = 1 + sum(accept)
        print(f"{label}: tau {tau:.2f}; " + " ".join(f"{a:.3f}" for a in accept))
        style = "--" if label.startswith("validation") else "-"
        ax.plot(range(1, len(accept) + 1), accept, style, marker="o", label=f"{label} (τ {tau:.2f})")
    ax.set_xlabel("draft position k")
    ax.set_ylabel("cycles whose first k drafts were accepted")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=120)
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()
