"""Training metrics: per-step counts -> loss_k, acc_k, cond_acc_k and the simulated τ, written to
`metrics.jsonl` (one JSON object per logged step) and TensorBoard, and plotted at the end.

    acc_k       student argmax == teacher argmax at step k, over step k's valid positions
    cond_acc_k  the same, over positions whose steps 0..k-1 were all valid and correct
    tau         1 + Σ_k Π_{j<=k} cond_acc_j   (the acceptance length a chain of K drafts would get,
                averaged over every answer position: the simulated τ)
    walk_accept_k, tau_walk   validation only: the answers walked cycle by cycle as decoding
                walks them (walk.py); accepted drafts per cycle at position k, and 1 + their sum
                (tokens per target call, what `draftsmith eval` measures, on this split)
    tv, tv_k / lk, lk_k   train --loss tv / lk: the objective trained on, under its name, per
                step and weighted as loss (which stays the soft CE, comparable across runs)

A record: {"split": "train"|"val", "step", "epoch", "tokens", "lr", "loss", "loss_k": [..],
"acc_k": [..], "cond_acc_k": [..], "tau", "acc_0", ...}.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from draftsmith.draft.step_weights import step_weights
from draftsmith.fsutil import append_line, atomic_write_text
from draftsmith.train.loss import LOSSES, STAT_KEYS

METRICS_FILE, PLOT_FILE = "metrics.jsonl", "metrics.png"
OBJECTIVES = tuple(loss for loss in LOSSES if loss != "ce")  # logged under their names besides the soft CE


def zero_stats(ttt: int) -> dict[str, torch.Tensor]:
    """Zero counts [ttt] per statistic, one per TTT step."""
    return {key: torch.zeros(ttt, dtype=torch.float64) for key in STAT_KEYS}


def add_stats(total: dict[str, torch.Tensor], stats: dict[str, torch.Tensor]) -> None:
    for key in STAT_KEYS:
        total[key] += stats[key].detach().double().cpu()


def simulated_tau(cond_acc: list[float]) -> float:
    tau, run = 1.0, 1.0
    for c in cond_acc:
        run *= c
        tau += run
    return tau


def summarise(stats: dict[str, torch.Tensor], reached_only: bool = False, loss: str = "ce") -> dict[str, Any]:
    """Counts summed over some batches -> the metric record (without step/split fields).
    `reached_only` (train --ttt-positions reached): ce_sum covers the reached positions, n_chain.
    `loss` (train --loss) other than ce: its objective (obj_sum) as well, under its name
    (`tv`, `tv_k` or `lk`, `lk_k`), averaged and weighted as `loss` and `loss_k` are."""
    n = stats["n_valid"].clamp(min=1)
    trained = (stats["n_chain"] if reached_only else stats["n_valid"]).clamp(min=1)
    loss_k = (stats["ce_sum"] / trained).tolist()  # per trained position
    acc_k = (stats["n_correct"] / n).tolist()
    cond_k = (stats["n_chain_correct"] / stats["n_chain"].clamp(min=1)).tolist()
    record = {
        "loss": sum(w * v for w, v in zip(step_weights(len(loss_k)), loss_k, strict=True)),
        "loss_k": loss_k,
        "acc_k": acc_k,
        "cond_acc_k": cond_k,
        "tau": simulated_tau(cond_k),
        "acc_0": acc_k[0],
        "valid_tokens": int(stats["n_valid"][0]),
    }
    if loss != "ce":
        obj_k = (stats["obj_sum"] / trained).tolist()
        record.update(
            {loss: sum(w * v for w, v in zip(step_weights(len(obj_k)), obj_k, strict=True)), f"{loss}_k": obj_k}
        )
    if stats["walk_cycles"][0] > 0:
        walk_k = (stats["walk_reach"] / stats["walk_cycles"]).tolist()
        record.update(walk_accept_k=walk_k, tau_walk=1.0 + sum(walk_k))
    return record


class MetricsLog:
    """Appends records to metrics.jsonl and TensorBoard (only on the writing rank)."""

    def __init__(self, out: Path, enabled: bool = True) -> None:
        self.path = Path(out) / METRICS_FILE
        self.enabled = enabled
        self.tb = None
        if enabled:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(Path(out) / "tensorboard"))

    def write(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        append_line(self.path, json.dumps(record))
        split, step = record["split"], record["step"]
        for key in ("loss", "tau", "lr", "tok_per_s", *OBJECTIVES):
            if key in record:
                self.tb.add_scalar(f"{split}/{key}", record[key], step)
        for key in ("loss_k", "acc_k", "cond_acc_k", *(f"{o}_k" for o in OBJECTIVES)):
            for k, v in enumerate(record.get(key, ())):
                self.tb.add_scalar(f"{split}/{key.removesuffix('_k')}_{k}", v, step)
        self.tb.flush()

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()


def read_metrics(out: Path) -> list[dict[str, Any]]:
    path = Path(out) / METRICS_FILE
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip().endswith("}")]


def truncate_metrics(out: Path, step: int) -> None:
    """Drop records logged after `step` (a resumed run re-logs them from its checkpoint)."""
    path = Path(out) / METRICS_FILE
    if path.exists():
        keep = [json.dumps(r) for r in read_metrics(out) if r["step"] <= step]
        atomic_write_text(path, "".join(line + "\n" for line in keep))


def plot_metrics(out: Path) -> Path | None:
    """metrics.png: loss per TTT step, acc per step, and τ over training steps (train and val)."""
    records = read_metrics(out)
    if not records:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for split, style in (("train", "-"), ("val", "o--")):
        rows = [r for r in records if r["split"] == split]
        if not rows:
            continue
        steps = [r["step"] for r in rows]
        for k in range(len(rows[0]["loss_k"])):
            axes[0].plot(steps, [r["loss_k"][k] for r in rows], style, label=f"{split} step {k}", color=f"C{k}")
            axes[1].plot(steps, [r["acc_k"][k] for r in rows], style, label=f"{split} step {k}", color=f"C{k}")
        axes[2].plot(steps, [r["tau"] for r in rows], style, label=split)
    for ax, title in zip(axes, ("soft-CE loss per TTT step", "accuracy per TTT step", "simulated τ")):
        ax.set_title(title)
        ax.set_xlabel("optimizer step")
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=6, ncol=2)
    axes[2].legend()
    fig.tight_layout()
    path = Path(out) / PLOT_FILE
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
