"""`draftsmith quickstart`: the whole pipeline on the embedded default target, no flags needed.

    synth (on-policy answers to bundled GSM8K prompts) -> prepare -> train online (no disk)
    -> eval chain tau on MT-bench questions -> summary

`--budget small` fits a 2-core CPU in under 10 minutes; `--budget full` is a real run for a
GPU. With a GPU present the default budget is `full`. Reruns resume (see `pipeline`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from draftsmith.config import DEFAULT_TARGET
from draftsmith.pipeline.config import QuickstartConfig
from draftsmith.pipeline.run import run_stages

BUDGETS: dict[str, list[tuple[str, str, dict[str, Any]]]] = {
    "small": [
        ("synth", "synth", {"prompts": "gsm8k", "limit": 48, "max_new_tokens": 96, "batch_size": 16,
                            "keep_unfinished": True}),
        ("prepare", "prepare", {"max_len": 512}),
        ("train", "train", {"epochs": 5, "ttt": 3, "batch_tokens": 2048, "draft_vocab_size": 4096,
                            "val_fraction": 0.1, "log_every": 2}),
        ("eval", "eval", {"bench": "mt_bench", "mode": "chain", "k": 3, "num_questions": 3, "max_new_tokens": 48}),
    ],
    "full": [  # the data and training of recipes/h200.yaml (about 30 minutes on one H200)
        ("synth", "synth", {"prompts": "gsm8k", "max_new_tokens": 256, "batch_size": 1024, "keep_unfinished": True}),
        ("magpie", "synth", {"magpie": 12000, "max_new_tokens": 256, "batch_size": 1024, "keep_unfinished": True}),
        ("magpie2", "synth", {"magpie": 4000, "turns": 2, "seed": 1, "max_new_tokens": 256, "batch_size": 1024,
                              "keep_unfinished": True}),
        ("prepare", "prepare", {"max_len": 2048}),
        ("train", "train", {"steps": 3900, "val_every": 975, "log_every": 100}),
        ("eval", "eval", {"bench": "mt_bench", "mode": "chain", "k": 7, "num_questions": 80, "max_new_tokens": 256}),
    ],
}


def run(cfg: QuickstartConfig) -> Path:
    budget = cfg.budget or ("full" if torch.cuda.is_available() else "small")
    root = Path(cfg.out)
    print(f"[quickstart] budget {budget}, target {DEFAULT_TARGET}, output {root}", flush=True)
    run_stages(root, BUDGETS[budget], common={"target": DEFAULT_TARGET})
    report = json.loads((root / "eval" / "report.json").read_text())
    summarize(root, report)
    return root


def summarize(root: Path, report: dict[str, Any]) -> None:
    table = Table(title="draftsmith quickstart", show_header=False, title_justify="left")
    table.add_column("", style="bold")
    table.add_column("")
    speedup = report.get("speedup")
    rows = {
        "acceptance length tau": f"{report['tau']:.2f} tokens per target call",
        "accept per position": " ".join(f"{a:.2f}" for a in report.get("accept_per_position", [])),
        "speed-up vs plain decoding": f"{speedup:.2f}x" if speedup else "not measured",
        "report": str(root / "eval" / "report.md"),
        "drafter": str(root / "train" / "drafter"),
    }
    for k, v in rows.items():
        table.add_row(k, v)
    Console().print(table)
