"""The tree draft's top-k as log-probs in two small Triton kernels on CUDA: torch's top-k indices and
log-probs, in fp32 and bf16, eagerly, in a CUDA graph and inside a compiled function; a
graphed, compiled tree draft with it (`DrafterProposer(fused_topk=True)`), as with torch's top-k;
and `draftsmith eval`'s tree on CUDA takes it by default (its start-up check passes, report.json
says `tree_topk: fused`)."""

import json

import pytest
import torch

from draftsmith.draft.checkpoint import save_drafter
from draftsmith.evaluate.decode import plain_generate, spec_generate
from draftsmith.evaluate.fused_topk import fused_top_log_probs
from draftsmith.evaluate.proposer import DrafterProposer, top_log_probs
from draftsmith.evaluate.questions import load_questions, turn_prompt
from draftsmith.runtime.engine import Graphed, TargetEngine
from draftsmith.runtime.sampling import Sampling
from draftsmith.target import load_target
from tests.helpers import SMOLLM2, cli_ok, random_drafter, write_jsonl


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


@pytest.mark.gpu
def test_tree_with_the_fused_top_k_drafts_as_torch_top_k():
    """A graphed, compiled tree draft (60 tokens, depth 7, top 10) with the fused top-k
    (`DrafterProposer(fused_topk=True)`): greedy output equal to plain decoding, and the same
    accepted drafts at every cycle as the tree with torch's top-k (fp32: no near-ties)."""
    target = load_target(SMOLLM2, device="cuda", dtype="fp32")
    drafter = random_drafter(target.model, 32000)
    eng = TargetEngine(target.model, drafter.config.aux_layer_ids, 512)
    props = {
        fused: DrafterProposer(
            drafter, Sampling(), 512, mode="tree", depth=7, top_k=10, total_tokens=60, compile=True, fused_topk=fused
        )
        for fused in (False, True)
    }
    eng.graph_rows(1)
    eng.graph_rows(props[True].size + 1)
    eng.graph_compact(props[True].path_len)
    for prop in props.values():
        prop.graph()
    for q in load_questions("mt_bench", 3):
        p = turn_prompt(target.tokenizer, q.turns[:1], [])
        plain = plain_generate(eng, p, 64, set(), Sampling()).tokens
        turns = {fused: spec_generate(eng, prop, p, 64, set(), Sampling()) for fused, prop in props.items()}
        assert turns[True].tokens == plain == turns[False].tokens
        assert turns[True].accepts == turns[False].accepts


@pytest.mark.gpu
def test_eval_tree_on_cuda_takes_the_fused_top_k_by_default(tiny_model, tiny_target_dir, tmp_path):
    drafter = save_drafter(random_drafter(tiny_model, draft_vocab_size=300), tmp_path / "drafter")
    bench = write_jsonl(tmp_path / "q.jsonl", [{"turns": ["What is 2+2?", "And 3+3?"]}])
    tree = ("--mode", "tree", "--depth", 4, "--top-k", 4, "--total-tokens", 12)
    cli_ok("eval", "--target", tiny_target_dir, "--drafter", drafter, "--bench", bench, *tree, "--max-new-tokens", 24,
           "--device", "cuda", "--out", tmp_path / "eval")  # fmt: skip
    report = json.loads((tmp_path / "eval" / "report.json").read_text())
    assert report["tree_topk"] == "fused" and report["cuda_graphs"] and report["drafter_graphed"]
    assert report["greedy_turns_matching_plain"] == report["turns"] == 2
