"""The tree draft's top-k as log-probs in one Triton kernel (evaluate/fused_topk.py), run by
Triton's interpreter on CPU where Triton is installed (vLLM's CPU build brings it; skipped
without; the GPU tier runs the compiled kernel): the indices of torch's top-k and its log-probs."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

CHECK = """
import torch
from draftsmith.evaluate.fused_topk import fused_top_log_probs
from draftsmith.evaluate.proposer import top_log_probs

torch.manual_seed(0)
for shape, k in [((1, 2, 32000), 10), ((3, 1000), 4), ((5, 64), 1), ((1, 1, 4096), 16)]:
    x = torch.randn(*shape)  # no ties
    vals, ids = fused_top_log_probs(x, k)
    want_vals, want_ids = top_log_probs(x, k)
    assert ids.shape == vals.shape == (*shape[:-1], k) and ids.dtype == torch.long
    assert torch.equal(ids, want_ids), shape
    assert torch.allclose(vals, want_vals, atol=1e-5), shape
x = torch.zeros(1, 8)
x[0, 3] = x[0, 5] = 1.0
assert fused_top_log_probs(x, 3)[1].tolist() == [[3, 5, 0]]  # ties: the lowest index first
try:
    fused_top_log_probs(x, 9)
except ValueError as e:
    assert "k=9 of 8 logits" in str(e)
else:
    raise AssertionError("k > V accepted")
print("ok")
"""


def test_fused_top_log_probs_equals_torch_topk_in_the_interpreter():
    pytest.importorskip("triton", reason="Triton is not installed (torch's CPU build has none)")
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(root / "src")}
    out = subprocess.run([sys.executable, "-c", CHECK], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
