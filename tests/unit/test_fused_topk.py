"""The tree draft's top-k as log-probs in two small Triton kernels (evaluate/fused_topk.py), run by
Triton's interpreter on CPU where Triton is installed (vLLM's CPU build brings it; skipped
without; the GPU tier runs the compiled kernel): the indices of torch's top-k and its log-probs, and a
tree draft with it drafting as with torch's top-k; `checked_on`, which lets eval's trees take it
where it gives torch's top k, refusing where it does not."""

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
x = torch.zeros(1, 9000)  # three chunks of the first kernel, ties across them
x[0, 8000] = x[0, 10] = x[0, 4100] = 1.0
assert fused_top_log_probs(x, 4)[1].tolist() == [[10, 4100, 8000, 0]]

# checked_on: the kernels where they give torch's top k, else None (with a line on stderr)
import draftsmith.evaluate.fused_topk as fused_topk

assert fused_topk.checked_on(torch.device("cpu"), 10, 32000, top_log_probs) is fused_top_log_probs
assert fused_topk.checked_on(torch.device("cpu"), 5000, 32000, top_log_probs) is None  # k > CHUNK: ValueError


def broken(x, k):
    raise RuntimeError("no kernel image")


def wrong(x, k):
    vals, ids = top_log_probs(x, k)
    return vals, ids.flip(-1)


for fake in (broken, wrong):
    fused_topk.fused_top_log_probs = fake
    assert fused_topk.checked_on(torch.device("cpu"), 10, 32000, top_log_probs) is None
fused_topk.fused_top_log_probs = fused_top_log_probs

# a tree draft with it (DrafterProposer(fused_topk=True)) drafts as with torch's top-k
from draftsmith.evaluate.decode import plain_generate, spec_generate
from draftsmith.evaluate.proposer import DrafterProposer
from draftsmith.layers import default_aux_layers
from draftsmith.runtime.engine import TargetEngine
from draftsmith.runtime.sampling import Sampling
from tests.helpers import make_tiny_llama, random_drafter

model = make_tiny_llama(1000)
eng = TargetEngine(model, default_aux_layers(2), 128)
drafter = random_drafter(model, draft_vocab_size=500, stride=2)
props = {
    fused: DrafterProposer(
        drafter, Sampling(), eng.max_len, mode="tree", depth=3, top_k=3, total_tokens=8, fused_topk=fused
    )
    for fused in (False, True)
}
for seed in range(2):
    prompt = torch.randint(0, 1000, (8,), generator=torch.Generator().manual_seed(seed)).tolist()
    plain = plain_generate(eng, prompt, 12, set(), Sampling()).tokens
    turns = {fused: spec_generate(eng, prop, prompt, 12, set(), Sampling()) for fused, prop in props.items()}
    assert turns[True].tokens == plain == turns[False].tokens
    assert turns[True].accepts == turns[False].accepts
assert props[True].top_log_probs is fused_top_log_probs and props[False].top_log_probs is top_log_probs
assert props[True].fused_topk and not props[False].fused_topk
print("ok")
"""


def test_fused_top_log_probs_equals_torch_topk_in_the_interpreter():
    pytest.importorskip("triton", reason="Triton is not installed (torch's CPU build has none)")
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": f"{root / 'src'}{os.pathsep}{root}"}
    out = subprocess.run([sys.executable, "-c", CHECK], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
    # checked_on's two refusals (k > CHUNK, a kernel that raises) and the wrong top k, each one line
    refusals = [line for line in out.stderr.splitlines() if "the tree's fused top-k is off on cpu" in line]
    assert len(refusals) == 3 and "ValueError: k=5000" in refusals[0] and "RuntimeError: no kernel image" in refusals[1]
    assert "its top k differ from torch's" in refusals[2]


def test_a_tree_on_cpu_drafts_with_torch_top_k_by_default():
    """`fused_topk=None` (the default) takes the Triton kernels on CUDA only: a CPU tree drafts with
    torch's top-k, a chain never asks."""
    from draftsmith.evaluate.proposer import DrafterProposer, top_log_probs
    from draftsmith.runtime.sampling import Sampling
    from tests.helpers import make_tiny_llama, random_drafter

    drafter = random_drafter(make_tiny_llama(1000), draft_vocab_size=500, stride=2)
    for mode in ("tree", "chain"):
        prop = DrafterProposer(drafter, Sampling(), 64, mode=mode, depth=3, top_k=3, total_tokens=8)
        assert prop.top_log_probs is top_log_probs and not prop.fused_topk
