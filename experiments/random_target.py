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
from transformers import LlamaConfig, LlamaForCausalLM

TOKENIZER = Path(__file__).resolve().parents[1] / "tests" / "assets" / "smollm2_tokenizer"


def main(out: Path) -> None:
    config = LlamaConfig(
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        head_dim=64,
        vocab_size=49152,
        max_position_embeddings=8192,
        rms_norm_eps=1e-5,
        rope_theta=100000.0,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(out)
    for f in TOKENIZER.iterdir():
        shutil.copy(f, out / f.name)
    print(f"random SmolLM2-135M-shaped target in {out}", flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
