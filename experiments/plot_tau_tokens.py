"""Validation simulated τ against training tokens, one line per training run (issue 13 item 4).

    python experiments/plot_tau_tokens.py "defaults=runs/h200/train_online" "old recipe=runs/old/train_online" \\
        --point "speculators 0.9.0=32e6:4.35" --out docs/figures/h200_tau_vs_tokens.png

A run is LABEL=FOLDER (a `draftsmith train` output folder: its metrics.jsonl); a validation
record's token count is interpolated from the training records around its step. `--point
LABEL=TOKENS:TAU[,TOKENS:TAU...]` adds measured points of a run whose metrics are not at hand
(several points: joined by a dashed line). Prints the points it plots.
"""

from __future__ import annotations

import argparse
import bisect
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from draftsmith.train.metrics import read_metrics


def val_curve(folder: Path) -> list[tuple[int, float, float | None]]:
    """(training tokens, val τ, walked val τ or None) at each validation of the run in `folder`. Training records come
    every `log_every` steps; the tokens at a validation step are interpolated between the records
    around it (rows hold a near-constant number of tokens), or scaled from the last one."""
    records = read_metrics(folder)
    steps, tokens = zip(*sorted((r["step"], r["tokens"]) for r in records if r["split"] == "train"))
    curve = []
    for r in records:
        if r["split"] == "val":
            i = bisect.bisect_right(steps, r["step"]) - 1
            if i < 0:
                at = tokens[0] * r["step"] / steps[0]
            elif steps[i] == r["step"] or i + 1 == len(steps):
                at = tokens[i] * r["step"] / steps[i]
            else:
                frac = (r["step"] - steps[i]) / (steps[i + 1] - steps[i])
                at = tokens[i] + frac * (tokens[i + 1] - tokens[i])
            curve.append((round(at), r["tau"], r.get("tau_walk")))
    return curve


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="LABEL=TRAIN_OUTPUT_FOLDER")
    ap.add_argument("--point", action="append", default=[], help="LABEL=TOKENS:TAU[,TOKENS:TAU...], measured points")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()

    fig, ax = plt.subplots(figsize=(7, 5.6))
    for spec in args.runs:
        label, _, folder = spec.partition("=")
        curve = val_curve(Path(folder))
        print(label, [(t, round(tau, 3)) for t, tau, _ in curve])
        ax.plot([t / 1e6 for t, _, _ in curve], [tau for _, tau, _ in curve], marker="o", label=label)
    for spec in args.point:
        label, _, value = spec.partition("=")
        points = [tuple(float(x) for x in pair.split(":")) for pair in value.split(",")]
        ax.plot(
            [t / 1e6 for t, _ in points],
            [tau for _, tau in points],
            marker="*",
            markersize=12,
            linestyle="--" if len(points) > 1 else "none",
            zorder=3,
            label=label,
        )
    ax.set_xlabel("training tokens (millions)")
    ax.set_ylabel("validation simulated τ (K = 7)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14))  # below the axes: no point hidden
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
