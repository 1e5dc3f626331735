"""The tree draft's top-k as log-probs in one Triton kernel: per row of logits [R, V], the k best
as log-probs (each less the row's logsumexp) and their indices, with one program per row holding
the whole row in registers: a max and a sum-exp reduction for the logsumexp, then k max-with-index
reductions, each masking out the one it found. torch's `topk` plus `logsumexp` (`top_log_probs`)
is 3-4 kernels per level that read the row several times (0.084 ms for 10 rows of 32,000 on an
H100, 2026-12-07 14:10), seven times a tree cycle.

`DrafterProposer(fused_topk=True)` drafts trees with it; `eval` does not yet: the cycle bench
times it first, alone (`topk_fused_ms` beside `topk_ms`) and in a whole tree cycle (`tree_fused`). Ties between equal
logits go to the lowest index (torch's `topk` leaves their order unspecified). Triton is torch's
own GPU compiler; where it is not installed (a CPU build) `fused_top_log_probs` is None."""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # a CPU build of torch comes without Triton
    triton = None

MAX_VOCAB = 1 << 17  # a row held in one program's registers: 131,072 logits at most


if triton is not None:

    @triton.jit
    def _top_log_probs_kernel(x_ptr, val_ptr, idx_ptr, v, stride, K: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        offs = tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * stride + offs, mask=offs < v, other=float("-inf")).to(tl.float32)  # [BLOCK]
        m = tl.max(x, 0)
        lse = m + tl.log(tl.sum(tl.exp(x - m), 0))
        for i in tl.static_range(K):
            best, at = tl.max(x, 0, return_indices=True, return_indices_tie_break_left=True)
            tl.store(val_ptr + row * K + i, best - lse)
            tl.store(idx_ptr + row * K + i, at.to(tl.int64))
            x = tl.where(offs == at, float("-inf"), x)

    def _launch(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        v = x.shape[-1]
        rows = x.reshape(-1, v)  # [R, V]
        if rows.stride(-1) != 1:
            rows = rows.contiguous()
        vals = torch.empty(rows.shape[0], k, device=x.device, dtype=torch.float32)  # [R, k]
        ids = torch.empty(rows.shape[0], k, device=x.device, dtype=torch.long)  # [R, k]
        block = triton.next_power_of_2(v)
        _top_log_probs_kernel[(rows.shape[0],)](
            rows, vals, ids, v, rows.stride(0), K=k, BLOCK=block, num_warps=16 if block >= 16384 else 8
        )
        return vals.view(*x.shape[:-1], k).to(x.dtype), ids.view(*x.shape[:-1], k)

    def fused_top_log_probs(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The k best of logits [..., V] as log-probs (in the logits' dtype, computed in fp32) and
        their indices, each [..., k], best first: `top_log_probs`'s result in one kernel launch.
        For CUDA tensors (or any, under TRITON_INTERPRET=1) of at most MAX_VOCAB logits a row."""
        if not 0 < k <= logits.shape[-1] <= MAX_VOCAB:
            raise ValueError(f"k={k} of {logits.shape[-1]} logits: 0 < k <= V <= {MAX_VOCAB}")
        return _launch(logits, k)

else:
    fused_top_log_probs = None
