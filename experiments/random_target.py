"""An HF folder with SmolLM2-135M-Instruct's shapes (or, with --shape 1.7b, SmolLM2-1.7B's) and
random weights, for timing runs on a machine that has no copy of the target: kernel times depend on
the shapes, not on the weights. The tokenizer is the test suite's copy of SmolLM2's (the two sizes
share it). Nothing measured on it says anything about acceptance (a random drafter on a random
target: tau ~ 1).

    python experiments/random_target.py /root/rand135m
    python experiments/random_target.py /root/rand1p7b --shape 1.7b   # built on the GPU if there is one
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: the tests' model helpers
from tests.helpers import ASSETS, smollm2_shaped

# SmolLM2-1.7B-Instruct's config.json, where it differs from the 135M's
SHAPES = {
    "135m": {},
    "1.7b": dict(
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=24,
        num_attention_heads=32,
        num_key_value_heads=32,
        rope_theta=130000.0,
    ),
}


def main(out: Path, shape: str) -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):  # 1.7B parameters initialise in seconds on a GPU, minutes on a CPU
        model = smollm2_shaped(**SHAPES[shape])
    model.to(torch.bfloat16).save_pretrained(out)
    for f in (ASSETS / "smollm2_tokenizer").iterdir():
        shutil.copy(f, out / f.name)
    n = sum(p.numel() for p in model.parameters())
    print(f"random SmolLM2-{shape}-shaped target ({n / 1e9:.2f}B parameters) in {out}", flush=True)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--shape", choices=sorted(SHAPES), default="135m")
    a = p.parse_args()
    main(a.out, a.shape)
