"""Training-time test (TTT): the K-step unroll of the drafter and its attention.

A batch is one or more packed rows: samples laid end to end, each with its own document id
(`doc [B, T]`, -1 for padding) and positions (`pos [B, T]`, restarting at 0). Step k of the
unroll, at row position t:

    input hidden   step 0: fc(aux[t]);  step k>0: step k-1's output at t (normed with norm_output)
    input token    ids[t+1+k]  (P-EAGLE, k>0: its placeholder hidden state and token, draft/peagle.py)
    position       pos[t] + k
    predicts       token t+2+k, against the target's distribution from final[t+1+k]
    attends to     step-0 keys at s <= t of the same sample, and the step-1..k keys at t only

`TTTAttention` is each drafter layer's `attend` callback (`ttt_attends`): it keeps the layer's
keys/values of earlier steps. Two backends give the same result: "eager" (step-0 scores and the
per-step diagonal under one softmax, O(T²)) and "flex" (`flex_attention` over all steps' keys
with a block-sparse mask, O(T); `crop_keys`). `valid_steps` masks a step whose target leaves
the sample. The backends and when each is used: docs/train.md.
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING

import torch

from draftsmith.draft.methods import method_of
from draftsmith.draft.peagle import placeholder_inputs
from draftsmith.runtime.capture import packed_positions

if TYPE_CHECKING:
    from torch.nn.attention.flex_attention import BlockMask, _mask_mod_signature


def shift_left(x: torch.Tensor, n: int, fill: int | float = 0) -> torch.Tensor:
    """x [B, T, ...] -> x[:, n:] padded at the end with `fill` to length T."""
    if n == 0:
        return x
    pad = torch.full_like(x[:, :n], fill)
    return torch.cat([x[:, n:], pad], dim=1)  # [B, T, ...]


def step_inputs(ids: torch.Tensor, pos: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Input token ids and position ids of TTT step k (both [B, T])."""
    return shift_left(ids, 1 + k), pos + k


def valid_steps(doc: torch.Tensor, loss_mask: torch.Tensor, teacher_ok: torch.Tensor, ttt: int) -> torch.Tensor:
    """[ttt, B, T] bool: step k at position t has a target token (t+2+k) in the same sample, that
    token is trained on (loss_mask), and the target's argmax there is in the draft vocab
    (teacher_ok[t+1+k], from the target state at t+1+k)."""
    out = []
    for k in range(ttt):
        same = (shift_left(doc, 2 + k, fill=-2) == doc) & (doc >= 0)
        out.append(same & shift_left(loss_mask, 2 + k).bool() & shift_left(teacher_ok, 1 + k).bool())
    return torch.stack(out)  # [ttt, B, T]


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """[B, nkv, T, hd] -> [B, nkv*n_rep, T, hd] (grouped-query attention)."""
    return x if n_rep == 1 else x.repeat_interleave(n_rep, dim=1)


def eager_ttt_attention(
    q: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor], doc: torch.Tensor
) -> torch.Tensor:
    """q [B, nh, T, hd]; keys/values: one [B, nkv, T, hd] per step so far (step 0 first)."""
    b, nh, t, hd = q.shape
    rep = nh // keys[0].shape[1]
    scale = 1.0 / math.sqrt(hd)
    acc = torch.promote_types(q.dtype, torch.float32)  # softmax in fp32 (or fp64 for fp64 inputs)
    k0, v0 = repeat_kv(keys[0], rep), repeat_kv(values[0], rep)  # [B, nh, T, hd]
    s0 = (q @ k0.transpose(-1, -2)).to(acc) * scale  # [B, nh, T, T]
    causal = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
    allowed = causal & (doc[:, :, None] == doc[:, None, :])  # [B, T, T]
    s0 = s0.masked_fill(~allowed[:, None], float("-inf"))
    diag = [(q * repeat_kv(kj, rep)).sum(-1, keepdim=True).to(acc) * scale for kj in keys[1:]]  # k x [B, nh, T, 1]
    p = torch.softmax(torch.cat([s0, *diag], dim=-1), dim=-1).to(q.dtype)  # [B, nh, T, T+k]
    out = p[..., :t] @ v0  # [B, nh, T, hd]
    for j, vj in enumerate(values[1:]):
        out = out + p[..., t + j : t + j + 1] * repeat_kv(vj, rep)
    return out


FLEX_BLOCK = 128  # flex_attention's sparse block size (its default), for both sides


@functools.cache
def _compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention

    # one compiled variant per key length ((k+1)·T for k < K): raise dynamo's default limit of 8
    for name in ("cache_size_limit", "recompile_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, max(getattr(torch._dynamo.config, name), 64))
    return torch.compile(flex_attention, dynamic=False)


def ttt_mask_mod(doc: torch.Tensor) -> _mask_mod_signature:
    """The flex mask_mod of TTT attention over the keys of steps 0, 1, .. concatenated, for doc
    [B, T]: key kv is position kv % T of step kv // T. It does not depend on the number of steps."""
    t = doc.shape[1]

    def mask_mod(bi, _h, qi, kv):
        j, p = kv // t, kv % t
        step0 = (j == 0) & (p <= qi) & (doc[bi, p] == doc[bi, qi])
        return step0 | ((j > 0) & (p == qi))

    return mask_mod


def crop_keys(block: BlockMask, kv_len: int) -> BlockMask:
    """A flex BlockMask cut to its first kv_len keys (a whole number of blocks): for a mask_mod
    that does not depend on the key count (`ttt_mask_mod`), the same as a mask made for kv_len.
    Each row lists its blocks first, in ascending order, so the kept ones stay first; the
    unlisted tail is clamped into range."""
    from torch.nn.attention.flex_attention import BlockMask

    assert kv_len % block.BLOCK_SIZE[1] == 0, (kv_len, block.BLOCK_SIZE)
    cols = kv_len // block.BLOCK_SIZE[1]

    def keep(num: torch.Tensor, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        listed = torch.arange(idx.shape[-1], device=idx.device) < num[..., None]  # [B, H, rows, all cols]
        kept = (listed & (idx < cols)).sum(-1, dtype=torch.int32)  # [B, H, rows]
        return kept, idx[..., :cols].clamp(max=cols - 1).contiguous()  # [B, H, rows, cols]

    full = (
        keep(block.full_kv_num_blocks, block.full_kv_indices) if block.full_kv_num_blocks is not None else (None, None)
    )
    return BlockMask.from_kv_blocks(
        *keep(block.kv_num_blocks, block.kv_indices),
        *full,
        BLOCK_SIZE=block.BLOCK_SIZE,
        mask_mod=block.mask_mod,
        seq_lengths=(block.seq_lengths[0], kv_len),
    )


def ttt_block_mask(doc: torch.Tensor, ttt: int, compiled: bool) -> BlockMask:
    """The flex BlockMask of TTT attention over the keys of `ttt` steps (doc [B, T])."""
    from torch.nn.attention.flex_attention import create_block_mask

    b, t = doc.shape
    return create_block_mask(
        ttt_mask_mod(doc), b, None, t, ttt * t, device=doc.device, BLOCK_SIZE=FLEX_BLOCK, _compile=compiled
    )


def flex_ttt_attention(
    q: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor], block: BlockMask, compiled: bool
) -> torch.Tensor:
    """q [B, nh, T, hd]; keys/values: one [B, nkv, T, hd] per step so far (step 0 first); block:
    their BlockMask."""
    from torch.nn.attention.flex_attention import flex_attention

    kcat = torch.cat(keys, dim=2)  # [B, nkv, (k+1)T, hd]
    vcat = torch.cat(values, dim=2)  # [B, nkv, (k+1)T, hd]
    attn = _compiled_flex() if compiled else flex_attention
    return attn(q, kcat, vcat, block_mask=block, enable_gqa=q.shape[1] != keys[0].shape[1])


class TTTAttention:
    """The `attend` callback for one unroll of `ttt` steps: call it once per step, in order
    (step 0 first). For flex, rows of a whole number of blocks (the trainer pads them so) get one
    block mask for all steps, cropped to each step's keys; other rows, one mask per step. Inside
    a region that torch.compile traces (the static TTT step, `loss.TTTObjective`), "flex" traces
    flex_attention and the mask's making into that region instead of calling their own compiled
    wrappers."""

    def __init__(self, doc: torch.Tensor, ttt: int, backend: str = "eager", whole: BlockMask | None = None) -> None:
        """`whole`: the block mask of all `ttt` steps, made by another layer's TTTAttention of the
        same doc (the mask does not depend on the layer); made here when not given."""
        assert backend in ("eager", "flex", "flex-eager"), backend
        self.doc, self.ttt, self.backend = doc, ttt, backend  # doc [B, T]
        self.compiled = backend == "flex" and not torch.compiler.is_compiling()
        if whole is None and backend != "eager" and doc.shape[1] % FLEX_BLOCK == 0:  # rows of whole blocks
            whole = ttt_block_mask(doc, ttt, self.compiled)
        self.whole = whole
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        assert len(self.keys) < self.ttt, "more steps than the unroll was made for"
        self.keys.append(k)
        self.values.append(v)
        if self.backend == "eager":
            return eager_ttt_attention(q, self.keys, self.values, self.doc)
        n, t = len(self.keys), self.doc.shape[1]
        block = crop_keys(self.whole, n * t) if self.whole is not None else ttt_block_mask(self.doc, n, self.compiled)
        return flex_ttt_attention(q, self.keys, self.values, block, self.compiled)


def ttt_attends(doc: torch.Tensor, ttt: int, backend: str, layers: int) -> list[TTTAttention]:
    """One TTTAttention per drafter layer for one unroll, sharing one block mask."""
    first = TTTAttention(doc, ttt, backend)
    return [first, *(TTTAttention(doc, ttt, backend, whole=first.whole) for _ in range(layers - 1))]


def unroll(
    drafter: torch.nn.Module,
    hidden0: torch.Tensor,
    ids: torch.Tensor,
    pos: torch.Tensor,
    doc: torch.Tensor,
    ttt: int,
    backend: str = "eager",
):
    """Yield (k, out_k [B, T, H]) for k = 0..ttt-1: the drafter's last layer's pre-norm outputs.
    hidden0 [B, T, H] is fc(aux); logits are `lm_head(norm(out_k))` (left to the caller, so the
    loss can compute them in chunks). A drafter whose one forward drafts the cycle (P-EAGLE) reads
    its placeholder token and hidden state at steps k >= 1 instead (draft/peagle.py: its parallel
    slots)."""
    attends = ttt_attends(doc, ttt, backend, drafter.config.num_layers)
    parallel = method_of(drafter).one_forward
    hidden = hidden0
    for k in range(ttt):
        ids_k, pos_k = step_inputs(ids, pos, k)
        if parallel and k > 0:
            ids_k, hidden = placeholder_inputs(drafter, ids_k, hidden0.dtype)  # [B, T], [B, T, H]
        embeds = drafter.embed_tokens(ids_k).to(hidden.dtype)  # [B, T, H]
        out = drafter.layers_forward(embeds, hidden, pos_k, attends)  # [B, T, H]
        yield k, out
        hidden = drafter.next_hidden(out)  # [B, T, H]: out, or norm(out) with norm_output


def doc_and_positions(
    lengths: list[int], total: int, device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Document ids and per-sample positions [total] for samples of `lengths` packed end to end
    and padded to `total` (padding: doc -1, positions 0.. as one more sample, as capture packs it)."""
    pad = total - sum(lengths)
    doc = torch.cat(
        [torch.full((n,), i, dtype=torch.long) for i, n in enumerate(lengths)]
        + [torch.full((pad,), -1, dtype=torch.long)]
    )  # [total]
    pos = packed_positions(list(lengths) + [pad])  # [total]
    return doc.to(device), pos.to(device)
