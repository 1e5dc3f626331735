"""The eager TTT attention's peak memory on CPU against `draft.shape.eager_attention_bytes`, the
estimate with which `train` refuses rows that would not fit and `plan` sizes them: one packed row
of T tokens, a K-step unroll and its backward, a drafter of 9 heads (the embedded target's),
each case in a fresh process (peak RSS is per process). A case `dflash:T:LAYERS` measures a
DFlash training step's blocks instead (train's default 512 anchors of block 8 in one row of T
tokens, forward and backward), whose SDPA with a boolean mask runs without a T x T score matrix.

    python bench/eager_attention_memory.py [--cases 2048:3:1 2048:7:1 4096:3:1 2048:3:2 dflash:8192:2]
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys

import torch

from draftsmith.draft.dflash import DFlashConfig, DFlashDrafter, block_mask
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


def one_dflash(tokens: int, layers: int, anchors: int = 512) -> None:
    cfg = DFlashConfig(
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=HEADS,
        num_key_value_heads=3,
        head_dim=8,
        vocab_size=100,
        draft_vocab_size=50,
        target_hidden_size=32,
        aux_layer_ids=[0, 1, 2],
        mask_token_id=7,
        num_layers=layers,
    )
    drafter, bs = DFlashDrafter(cfg), cfg.block_size
    doc = (torch.arange(tokens) >= tokens // 2).long()  # [T]: two samples
    pos = torch.arange(tokens)[None]  # [1, T]
    aux = torch.randn(1, tokens, 3 * 32, requires_grad=True)  # [1, T, n_aux*H_t]
    at = torch.randperm(tokens - bs)[:anchors].sort().values  # [n]
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    ids = drafter.block_ids(torch.randint(0, 100, (anchors,))).flatten()[None]  # [1, n*bs]
    block_pos = (at[:, None] + torch.arange(bs)).flatten()[None]  # [1, n*bs]
    out = drafter(ids, block_pos, drafter.context_kv(drafter.context(aux), pos), block_mask(at, doc, bs, tokens)[None])
    out.sum().backward()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    dense = HEADS * anchors * bs * (tokens + anchors * bs) * 4  # one layer's fp32 scores, were they materialised
    print(
        f"DFlash T={tokens} layers={layers}: peak {peak / 1e9:.2f} GB (dense scores would be {dense / 1e9:.2f} GB a layer)"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", nargs="+", default=["2048:3:1", "2048:7:1", "4096:3:1", "2048:3:2"])
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        if args.one.startswith("dflash:"):
            one_dflash(*map(int, args.one.removeprefix("dflash:").split(":")))
        else:
            one(*map(int, args.one.split(":")))
        return
    for case in args.cases:
        subprocess.run([sys.executable, __file__, "--one", case], check=True)


if __name__ == "__main__":
    main()
