"""The tree draft's top-k as log-probs in two small Triton kernels: per row of logits [R, V], the
k best as log-probs (each less the row's logsumexp) and their indices. Each row is cut into
chunks of CHUNK logits, one program each (R x V/CHUNK programs, a chunk held in registers): the
chunk's max, its sum of exp(x - max), and its k best by k max-with-index reductions, each masking
out the one it found. One program per row then merges the chunks' k best and their logsumexp
parts. torch's `topk` plus `logsumexp` (`top_log_probs`) is 3-4 kernels per level that read the
row several times (0.084 ms for 10 rows of 32,000 on an H100, 2026-12-07 14:10), seven times a
tree cycle.

On an H100 (2026-12-07 17:00) it takes 0.018-0.020 ms where torch's takes 0.084, and a compiled
tree cycle of 60 tokens, 7 levels, top 10 drops from 5.62 to 5.45 ms (the chain's: 4.77). Every tree
that `DrafterProposer` drafts on CUDA uses it (`fused_topk=None`), once `checked_on` has seen it
give torch's top k there; `fused_topk=False` keeps torch's (the cycle bench's `tree_torch_topk`).
Ties between equal logits go to the lowest index (torch's `topk` leaves their order unspecified).
Triton is torch's own GPU compiler; where it is not installed `fused_top_log_probs` is None."""

from __future__ import annotations

import sys
from collections.abc import Callable

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # a CPU build of torch comes without Triton
    triton = None

CHUNK = 4096  # logits a program of the first kernel holds: 32 registers a thread at 4 warps


if triton is not None:

    @triton.jit
    def _chunk_top_kernel(x_ptr, top_ptr, at_ptr, part_ptr, v, stride, K: tl.constexpr, CHUNK: tl.constexpr):
        row, chunk = tl.program_id(0), tl.program_id(1)
        chunks = tl.num_programs(1)
        lane = tl.arange(0, CHUNK)
        offs = chunk * CHUNK + lane
        x = tl.load(x_ptr + row * stride + offs, mask=offs < v, other=float("-inf")).to(tl.float32)  # [CHUNK]
        m = tl.max(x, 0)
        tl.store(part_ptr + (row * chunks + chunk) * 2, m)
        tl.store(part_ptr + (row * chunks + chunk) * 2 + 1, tl.sum(tl.exp(x - m), 0))
        out = (row * chunks + chunk) * K
        for i in tl.static_range(K):  # the chunk's k best, best first; ties: the lowest index first
            best, at = tl.max(x, 0, return_indices=True, return_indices_tie_break_left=True)
            tl.store(top_ptr + out + i, best)
            tl.store(at_ptr + out + i, chunk * CHUNK + at)
            x = tl.where(lane == at, float("-inf"), x)

    @triton.jit
    def _merge_kernel(top_ptr, at_ptr, part_ptr, val_ptr, idx_ptr, chunks, K: tl.constexpr, CAND: tl.constexpr):
        row = tl.program_id(0)
        # lane c: the row's candidate c (its chunks' k best, in chunk then rank order, so that ties resolve
        # to the lowest index) and, for the logsumexp, chunk c's max and sum of exp
        c = tl.arange(0, CAND)
        live = c < chunks * K
        x = tl.load(top_ptr + row * chunks * K + c, mask=live, other=float("-inf"))  # [CAND]
        at = tl.load(at_ptr + row * chunks * K + c, mask=live, other=0)  # [CAND]
        ms = tl.load(part_ptr + (row * chunks + c) * 2, mask=c < chunks, other=float("-inf"))
        ss = tl.load(part_ptr + (row * chunks + c) * 2 + 1, mask=c < chunks, other=0.0)
        m = tl.max(ms, 0)
        lse = m + tl.log(tl.sum(ss * tl.exp(ms - m), 0))
        for i in tl.static_range(K):
            best, pos = tl.max(x, 0, return_indices=True, return_indices_tie_break_left=True)
            tl.store(val_ptr + row * K + i, best - lse)
            tl.store(idx_ptr + row * K + i, tl.sum(tl.where(c == pos, at, 0), 0).to(tl.int64))
            x = tl.where(c == pos, float("-inf"), x)

    def fused_top_log_probs(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The k best of logits [..., V] as log-probs (in the logits' dtype, computed in fp32) and
        their indices, each [..., k], best first: `top_log_probs`'s result in two kernel launches.
        For CUDA tensors (or any, under TRITON_INTERPRET=1), 0 < k <= min(V, CHUNK)."""
        v = logits.shape[-1]
        if not 0 < k <= min(v, CHUNK):
            raise ValueError(f"k={k} of {v} logits: 0 < k <= min(V, {CHUNK})")
        rows = logits.reshape(-1, v)  # [R, V]
        if rows.stride(-1) != 1:
            rows = rows.contiguous()
        r, chunks = rows.shape[0], triton.cdiv(v, CHUNK)
        dev = logits.device
        top = torch.empty(r, chunks, k, device=dev, dtype=torch.float32)  # [R, C, k]: each chunk's k best
        at = torch.empty(r, chunks, k, device=dev, dtype=torch.int32)  # [R, C, k]: their indices in the row
        part = torch.empty(r, chunks, 2, device=dev, dtype=torch.float32)  # [R, C, 2]: max, sum of exp(x - max)
        _chunk_top_kernel[(r, chunks)](rows, top, at, part, v, rows.stride(0), K=k, CHUNK=CHUNK, num_warps=4)
        vals = torch.empty(r, k, device=dev, dtype=torch.float32)  # [R, k]
        ids = torch.empty(r, k, device=dev, dtype=torch.long)  # [R, k]
        cand = triton.next_power_of_2(max(chunks * k, chunks))
        _merge_kernel[(r,)](top, at, part, vals, ids, chunks, K=k, CAND=cand, num_warps=1 if cand <= 128 else 4)
        return vals.view(*logits.shape[:-1], k).to(logits.dtype), ids.view(*logits.shape[:-1], k)

else:
    fused_top_log_probs = None


TopLogProbs = Callable[[torch.Tensor, int], tuple[torch.Tensor, torch.Tensor]]


def checked_on(device: torch.device, k: int, vocab: int, reference: TopLogProbs) -> TopLogProbs | None:
    """`fused_top_log_probs` where it runs on `device` for k of `vocab` logits and gives what
    `reference` (torch's `top_log_probs`, proposer.py: passed in, so that this module imports
    nothing of the proposer that imports it) gives on two rows of random fp32 logits (the indices
    equal, the log-probs within 1e-5); None where it does not, with one stderr line that says why."""
    why = "Triton is not installed"
    if fused_top_log_probs is not None:
        x = torch.randn(2, vocab, device=device, generator=torch.Generator(device).manual_seed(0))  # [2, V]: no ties
        try:
            (vals, ids), (want_vals, want_ids) = fused_top_log_probs(x, k), reference(x, k)
        except Exception as e:  # a kernel that fails to build or launch here: torch's top-k drafts instead
            why = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        else:
            if torch.equal(ids, want_ids) and torch.allclose(vals, want_vals, atol=1e-5):
                return fused_top_log_probs
            why = "its top k differ from torch's"
    print(f"eval: the tree's fused top-k is off on {device} ({why}); torch's top-k drafts", file=sys.stderr, flush=True)
    return None
