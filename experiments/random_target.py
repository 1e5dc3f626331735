"""An HF folder with SmolLM2-135M-Instruct's shapes and random weights, for timing runs on a
machine that has no copy of the target: kernel times depend on the shapes, not on the weights.
The tokenizer is the test suite's copy of SmolLM2's. Nothing measured on it says anything about
acceptance (a random drafter on a random target: tau ~ 1).

    python experiments/random_target.py /root/rand135m
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: the tests' model helpers
from tests.helpers import ASSETS, smollm2_shaped


def main(out: Path) -> None:
    smollm2_shaped().to(torch.bfloat16).save_pretrained(out)
    for f in (ASSETS / "smollm2_tokenizer").iterdir():
        shutil.copy(f, out / f.name)
    print(f"random SmolLM2-135M-shaped target in {out}", flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
