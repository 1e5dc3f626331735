"""`draftsmith quickstart`: the whole pipeline on the embedded default target, no flags needed.

    small (CPU): synth (on-policy answers to bundled GSM8K prompts) -> prepare -> extract
                 -> train offline -> eval chain tau on MT-bench questions -> summary
    full (GPU):  the H200 recipe's data, vocab, online training (no store on disk) and chain eval:
                 its stages read from the packaged recipe (assets/recipes/h200.yaml, which
                 recipes/h200.yaml links to), so the two cannot drift apart

`--budget small` takes 5 to 16 minutes on a 2-core CPU (experiments/LOG.md); `--budget full` is a real run for a
GPU. With a GPU present the default budget is `full`. Reruns resume (see `pipeline`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from draftsmith.assets import H200_RECIPE
from draftsmith.config import DEFAULT_TARGET, load_yaml_mapping
from draftsmith.draft.checkpoint import read_drafter_record
from draftsmith.pipeline.config import QuickstartConfig
from draftsmith.pipeline.run import parse_stages, run_stages

SMALL: list[tuple[str, str, dict[str, Any]]] = [
    (
        "synth",
        "synth",
        {"prompts": "gsm8k", "limit": 48, "max_new_tokens": 96, "batch_size": 16, "keep_unfinished": True},
    ),
    # self-prompted chat (Magpie), so that the drafter sees more than math before MT-bench
    ("magpie", "synth", {"magpie": 48, "max_new_tokens": 96, "batch_size": 16, "keep_unfinished": True}),
    ("prepare", "prepare", {"max_len": 512}),
    # the store (a few MB) is captured once, so the 5 epochs run the drafter only
    ("extract", "extract", {}),
    # train's defaults, but 512-token rows and lr 3e-3: a few CPU minutes is ~150 optimizer
    # steps, where more and shorter steps at a higher lr measured best (on the 48 GSM8K
    # answers alone: val tau 1.76, against 1.24 with 8k rows and lr 1e-3, the defaults then);
    # and every token trained on, the prompts' too (the target's distribution teaches there as
    # well): on these 96 conversations MT-bench tau 1.19 against 1.14 at K=1 (experiments/LOG.md)
    (
        "train",
        "train",
        {
            "hidden": "@extract",
            "epochs": 5,
            "depth": 3,
            "batch_tokens": 512,
            "lr": 3e-3,
            "draft_vocab_size": 4096,
            "val_fraction": 0.1,
            "log_every": 10,
            "loss_tokens": "all",
        },
    ),
    # the chain length (1..3) with the best predicted speed-up on this CPU, from a short calibration
    (
        "eval",
        "eval",
        {
            "bench": "mt_bench",
            "mode": "chain",
            "depth": "auto",
            "depth_max": 3,
            "num_questions": 3,
            "max_new_tokens": 48,
        },
    ),
]
# what `full` runs of the H200 recipe (about 30 minutes on one H200): its data stages, whatever
# they are, then these two
DATA_COMMANDS = ("synth", "prepare", "vocab")
FULL_AFTER_DATA = ("train_online", "eval_chain")


def budget_stages(budget: str) -> list[tuple[str, str, dict[str, Any]]]:
    """The stages of a budget: SMALL, or the packaged H200 recipe's data stages (every synth,
    prepare and vocab) and FULL_AFTER_DATA, in the recipe's order."""
    if budget == "small":
        return SMALL
    stages = parse_stages(load_yaml_mapping(H200_RECIPE, "recipe")["stages"])
    return [stage for stage in stages if stage[1] in DATA_COMMANDS or stage[0] in FULL_AFTER_DATA]


def run(cfg: QuickstartConfig) -> Path:
    budget = cfg.budget or ("full" if torch.cuda.is_available() else "small")
    root = Path(cfg.out)
    print(f"[quickstart] budget {budget}, target {DEFAULT_TARGET}, output {root}", flush=True)
    stages = budget_stages(budget)
    products = run_stages(root, stages, common={"target": DEFAULT_TARGET})
    last = {command: products[name] for name, command, _ in stages}  # the last train and eval
    summarize(last["eval"], last["train"])
    return root


def summarize(report_dir: Path, drafter: Path) -> None:
    report = json.loads((report_dir / "report.json").read_text())
    table = Table(title="draftsmith quickstart", show_header=False, title_justify="left")
    table.add_column("", style="bold")
    table.add_column("")
    speedup = report.get("speedup")
    rows = {
        "validation tau": validation(drafter),
        "acceptance length tau": f"{report['tau']:.2f} tokens per target call",
        "accepted per position": accepted_per_position(report.get("accept_per_position")),
        "speed-up vs plain decoding": f"{speedup:.2f}x" if speedup else "not measured",
        "break-even tau on this machine": break_even(report.get("shape")),
        "report": str(report_dir / "report.md"),
        "drafter": str(drafter),
    }
    for k, v in rows.items():
        table.add_row(k, v)
    Console().print(table)


def accepted_per_position(shares: list[float] | None) -> str:
    """P(draft position j accepted) over all cycles, j = 1.. (eval's --depth auto line gives it given
    position j-1 accepted)."""
    return " ".join(f"{a:.2f}" for a in shares) + " of the cycles" if shares else "not measured"


def validation(drafter: Path) -> str:
    """The validation that chose the drafter (drafter.json's `meta.val`): simulated τ and, when
    recorded, the walked one."""
    val = read_drafter_record(drafter).get("meta", {}).get("val") or {}
    if "tau" not in val:
        return "not recorded"
    walked = f", walked {val['tau_walk']:.2f} (eval's τ on such prompts)" if "tau_walk" in val else ""
    return f"simulated {val['tau']:.2f}{walked}"


def break_even(shape: dict[str, Any] | None) -> str:
    """The tau from which the calibrated cycle pays on this machine (`Calibration.break_even`)."""
    if not shape:
        return "not calibrated (--depth auto measures it)"
    return f"{shape['break_even_tau']:.2f} (a {shape['chosen']} cycle costs {shape['break_even_tau']:.2f} plain tokens)"
