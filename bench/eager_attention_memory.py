"""The eager TTT attention's peak memory on CPU against `draft.shape.eager_attention_bytes`, the
estimate with which `train` refuses rows that would not fit and `plan` sizes them: one packed row
of T tokens, a K-step unroll and its backward, a drafter of 9 heads (the embedded target's),
each case in a fresh process (peak RSS is per process).

    python bench/eager_attention_memory.py [--cases 2048:3:1 2048:7:1 4096:3:1 2048:3:2]
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys

import torch

from draftsmith.draft.model import DrafterConfig, Eagle3Drafter
from draftsmith.draft.shape import eager_attention_bytes
from draftsmith.train.ttt import doc_and_positions, unroll

HEADS = 9


def one(tokens: int, depth: int, layers: int) -> None:
    cfg = DrafterConfig(
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=HEADS,
        num_key_value_heads=3,
        head_dim=8,
        vocab_size=100,
        draft_vocab_size=50,
        target_hidden_size=32,
        aux_layer_ids=[0, 1, 2],
        num_layers=layers,
    )
    drafter = Eagle3Drafter(cfg)
    doc, pos = doc_and_positions([tokens // 2, tokens - tokens // 2], tokens)
    ids = torch.randint(0, 100, (1, tokens))
    hidden = torch.randn(1, tokens, 64, requires_grad=True)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    outs = [out for _, out in unroll(drafter, hidden, ids, pos[None], doc[None], depth, backend="eager")]
    sum(o.sum() for o in outs).backward()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    est = eager_attention_bytes(tokens, HEADS, depth, layers)
    print(
        f"T={tokens} K={depth} layers={layers}: peak {peak / 1e9:.2f} GB, estimate {est / 1e9:.2f} GB ({est / peak:.2f}x)"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", nargs="+", default=["2048:3:1", "2048:7:1", "4096:3:1", "2048:3:2"])
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        one(*map(int, args.one.split(":")))
        return
    for case in args.cases:
        subprocess.run([sys.executable, __file__, "--one", case], check=True)


if __name__ == "__main__":
    main()
