"""The tree draft's top-k as log-probs in one Triton kernel on CUDA: torch's top-k indices and
log-probs, in fp32 and bf16, eagerly, in a CUDA graph and inside a compiled function (how the
graphed, compiled tree draft would run it)."""

import pytest
import torch

from draftsmith.evaluate.fused_topk import fused_top_log_probs
from draftsmith.evaluate.proposer import top_log_probs
from draftsmith.runtime.engine import Graphed


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_top_log_probs_equals_torch_on_cuda(dtype):
    torch.manual_seed(0)
    x = torch.randn(4, 10, 32000, device="cuda").to(dtype)
    want_vals, want_ids = top_log_probs(x.float(), 10)
    compiled = torch.compile(lambda t: fused_top_log_probs(t * 1.0, 10), dynamic=False)
    graphed = Graphed(lambda t: fused_top_log_probs(t, 10), x)
    for vals, ids in (fused_top_log_probs(x, 10), graphed(x), compiled(x)):
        assert vals.dtype == dtype and ids.dtype == torch.long
        # bf16 logits tie more often: the chosen logits equal, the log-probs within bf16 rounding
        assert torch.equal(x.gather(-1, ids), x.gather(-1, want_ids))
        assert torch.allclose(vals.float(), want_vals, atol=1e-5 if dtype == torch.float32 else 2e-2)
