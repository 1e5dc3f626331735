"""Issue 40's side-by-side (experiments/methods_h200.sh) as one Markdown table and three plots: each
run's validation tau by training tokens, its tau by question set, and its MT-bench speed-up per
category at batch 1 and 16.

    python experiments/summarise_methods.py RUN_DIR [--out docs/figures] [--runs m_ce m_lk ...]

RUN_DIR holds the runs (RUN_DIR/m_ce/metrics.jsonl) and their evals: each run's own
(RUN_DIR/m_ce_heldout/report.json, _humaneval; before 2026-12-04 also _mtbench_b1, _mtbench_b16,
_mtbench_tau) and the side-by-side MT-bench evals (`eval --compare`: RUN_DIR/methods_mtbench_b1/
report.json for the first run, compare/NAME/report.json for the others, and _b16); what is
missing prints as "-".
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from plot_tau_tokens import val_curve  # experiments/, this script's folder

from draftsmith.train.metrics import read_metrics

LABELS = {
    "m_ce": "EAGLE-3, CE",
    "m_lk": "EAGLE-3, LK",
    "m_tv": "EAGLE-3, TV",
    "m_peagle": "P-EAGLE",
    "m_peagle4": "P-EAGLE, 4 layers",
    "m_dflash": "DFlash",
    "f_ce": "EAGLE-3, the recipe",
    "f_peagle": "P-EAGLE",
    "f_dflash": "DFlash",
}


def train_speed(run: Path) -> float | None:
    """The run's last logged training throughput (tokens/s)."""
    speeds = [r["tok_per_s"] for r in read_metrics(run) if r.get("split") == "train" and r.get("tok_per_s")]
    return speeds[-1] if speeds else None


def report(root: Path, name: str, suffix: str) -> dict | None:
    """Run `name`'s eval report of kind `suffix` (mtbench_b1, heldout, ...): its own, or its part
    of the side-by-side eval (methods_SUFFIX)."""
    side = root / f"methods_{suffix}"
    for path in (root / f"{name}_{suffix}" / "report.json", side / "compare" / name / "report.json"):
        if path.exists():
            return json.loads(path.read_text())
    first = side / "report.json"  # the side-by-side eval's --drafter
    r = json.loads(first.read_text()) if first.exists() else None
    return r if r is not None and Path(r["drafter"]).name == name else None


def fmt(x: float | None, spec: str = ".2f", unit: str = "") -> str:
    return "-" if x is None else f"{x:{spec}}{unit}"


def table(root: Path, runs: list[str]) -> str:
    head = (
        "| run | tokens | val τ (walked) | train tok/s | MT-bench τ, speed-up b1 | b16 | held-out τ | HumanEval τ |\n"
        "|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    for name in runs:
        if not (root / name / "metrics.jsonl").exists():
            continue
        curve = val_curve(root / name)
        tok, tau, walk = curve[-1] if curve else (None, None, None)
        tok = tok / 1e6 if tok is not None else None
        b1, b16 = report(root, name, "mtbench_b1"), report(root, name, "mtbench_b16")
        tau_only = report(root, name, "mtbench_tau")
        mt_tau = (b1 or b16 or tau_only or {}).get("tau")
        held, code = report(root, name, "heldout"), report(root, name, "humaneval")
        lines.append(
            f"| {LABELS.get(name, name)} | {fmt(tok, '.1f', 'M')} | {fmt(tau, '.3f')} ({fmt(walk, '.3f')}) "
            f"| {fmt(train_speed(root / name), ',.0f')} | {fmt(mt_tau)}, {fmt((b1 or {}).get('speedup'), '.2f', '×')} "
            f"| {fmt((b16 or {}).get('tau'))}, {fmt((b16 or {}).get('speedup'), '.2f', '×')} "
            f"| {fmt((held or {}).get('tau'))} | {fmt((code or {}).get('tau'))} |"
        )
    return "\n".join(lines)


def categories(root: Path, runs: list[str]) -> str:
    """Per-category MT-bench speed-up at batch 1 (and tau), one row per run."""
    reports = {name: report(root, name, "mtbench_b1") for name in runs}
    reports = {k: v for k, v in reports.items() if v}
    if not reports:
        return ""
    cats = sorted({c for r in reports.values() for c in r["categories"]})
    lines = ["| run | " + " | ".join(cats) + " |", "|---|" + "---|" * len(cats)]
    for name, r in reports.items():
        cells = [
            f"{fmt(r['categories'][c].get('speedup'), '.2f', '×')} ({fmt(r['categories'][c].get('tau'))})" for c in cats
        ]
        lines.append(f"| {LABELS.get(name, name)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plots(root: Path, runs: list[str], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6, 4))
    for name in runs:
        if (root / name / "metrics.jsonl").exists() and (curve := val_curve(root / name)):
            ax.plot([c[0] / 1e6 for c in curve], [c[1] for c in curve], marker="o", label=LABELS.get(name, name))
    ax.set(xlabel="training tokens (M)", ylabel="validation τ (simulated, K=7)", title="Validation τ by method")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "methods_val_tau.png", dpi=120)
    plt.close(fig)
    sets = {
        "MT-bench": ("mtbench_b1", "mtbench_b16", "mtbench_tau"),
        "held-out": ("heldout",),
        "HumanEval": ("humaneval",),
    }
    fig, ax = plt.subplots(figsize=(6, 4))
    width = 0.8 / len(runs)
    for i, name in enumerate(runs):
        taus = [next((r["tau"] for sfx in sfxs if (r := report(root, name, sfx))), 0) for sfxs in sets.values()]
        ax.bar([j + i * width for j in range(len(sets))], taus, width, label=LABELS.get(name, name))
    ax.set_xticks([j + width * (len(runs) - 1) / 2 for j in range(len(sets))], list(sets))
    ax.set(ylabel="τ (K=7 chain, greedy)", title="τ by question set (0: not measured)")
    ax.set_ylim(0, ax.get_ylim()[1] * 1.25)  # room for the legend above the bars
    ax.grid(axis="y", alpha=0.3)
    ax.legend(ncol=2, fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "methods_tau_by_set.png", dpi=120)
    plt.close(fig)
    panels = {b: {name: r for name in runs if (r := report(root, name, f"mtbench_b{b}"))} for b in (1, 16)}
    panels = {b: reports for b, reports in panels.items() if reports}
    if not panels:
        return
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, 3.6 * len(panels)), squeeze=False)
    for ax, (batch, reports) in zip(axes[:, 0], panels.items()):
        cats = sorted({c for r in reports.values() for c in r["categories"]})
        width = 0.8 / len(reports)
        for i, (name, r) in enumerate(reports.items()):
            xs = [j + i * width for j in range(len(cats))]
            ax.bar(xs, [r["categories"][c].get("speedup") or 0 for c in cats], width, label=LABELS.get(name, name))
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xticks([j + width * (len(reports) - 1) / 2 for j in range(len(cats))], cats, rotation=20)
        ax.set(ylabel="speed-up over plain decoding", title=f"MT-bench, batch {batch}, greedy: speed-up per category")
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "methods_mtbench_speedup.png", dpi=120)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", type=Path)
    ap.add_argument("--out", type=Path, default=Path("docs/figures"))
    ap.add_argument("--runs", nargs="+", default=["m_ce", "m_lk", "m_peagle", "m_peagle4", "m_dflash"])
    args = ap.parse_args()
    print(table(args.root, args.runs))
    print()
    print(categories(args.root, args.runs))
    plots(args.root, args.runs, args.out)


if __name__ == "__main__":
    main()
