"""GPU checks of the eval engine (run with --run-gpu on a CUDA machine): CUDA-graphed
forwards give the eager logits, and graphed speculative decoding (compiled drafter step, one
decoder layer or two) equals graphed plain decoding on the embedded default, at batch 1 and in a batch of 4 rows
(fp32, so that batching cannot flip a near-tie); a sampled chain draws in its graph as it
does without one; the target's forward compiled inside its graphs (eval --compile-target)
gives the eager logits; the adaptive chain (eval --stop-below) graphs its steps and answers as
plain decoding does."""

from __future__ import annotations

import pytest
import torch

from draftsmith.evaluate.decode import plain_generate, spec_generate
from draftsmith.evaluate.proposer import DrafterProposer
from draftsmith.evaluate.questions import load_questions, turn_prompt
from draftsmith.runtime.engine import TargetEngine
from draftsmith.runtime.sampling import Sampling
from draftsmith.target import load_target
from tests.helpers import SMOLLM2, random_drafter

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def target():
    return load_target(SMOLLM2, device="cuda", dtype="fp32")


def test_graphed_forward_equals_eager(target):
    eng = TargetEngine(target.model, [2, 15, 27], 128)
    eng.graph(8)
    eng.graph_rows(
        8
    )  # eval's rows path, its mask building inside the graph (captured before the prefill, as eval does)
    ids = torch.randint(0, 1000, (40,), device="cuda")
    eng.prefill(ids[:32])
    slots = torch.arange(32, 40, device="cuda")
    graphed, aux_g = (x.clone() for x in eng.forward(ids[32:], slots, slots, eng.causal_mask(32, 8)))
    eager, aux_e = eng._forward(ids[None, 32:], slots[None], slots[None], eng.causal_mask(32, 8)[None, None])
    assert torch.allclose(graphed, eager, atol=1e-4) and torch.allclose(aux_g, aux_e, atol=1e-4)
    base, n = torch.zeros(1, dtype=torch.long, device="cuda"), torch.full((1,), 32, device="cuda")
    rows_g, rows_aux = (x.clone() for x in eng.rows_forward(ids[None, 32:], base, n))
    assert torch.allclose(rows_g[0], eager[0], atol=1e-4) and torch.allclose(rows_aux[0], aux_e[0], atol=1e-4)


@pytest.mark.parametrize("num_layers", [1, 2])
@pytest.mark.parametrize("mode", ["chain", "tree"])
def test_graphed_spec_equals_plain(target, mode, num_layers):
    drafter = random_drafter(target.model, 32000, num_layers=num_layers)
    eng = TargetEngine(target.model, drafter.config.aux_layer_ids, 512)
    prop = DrafterProposer(drafter, Sampling(), 512, mode=mode, depth=7, top_k=10, total_tokens=60, compile=True)
    eng.graph_rows(1)
    eng.graph_rows(prop.size + 1)
    eng.graph_compact(prop.path_len)
    prop.graph()
    assert prop.compiled  # the compiled drafter step inside the captured cycle
    for q in load_questions("mt_bench", 4):
        p = turn_prompt(target.tokenizer, q.turns[:1], [])
        assert (
            spec_generate(eng, prop, p, 64, set(), Sampling()).tokens
            == plain_generate(eng, p, 64, set(), Sampling()).tokens
        )


@pytest.mark.parametrize("scope", ["forward", "layers"])
def test_compiled_target_forward_equals_eager(target, scope):
    """eval --compile-target: the target's forward compiled (inductor) inside its CUDA graph,
    whole or one decoder layer's step for all (compile_scope), gives the eager logits and aux
    states, and speculative decoding on it equals plain decoding on it."""
    drafter = random_drafter(target.model, 32000)
    eng = TargetEngine(target.model, drafter.config.aux_layer_ids, 512, compile=True, compile_scope=scope)
    eng.graph_rows(1)
    eng.graph_rows(8)
    assert eng.compiled  # no fallback to the eager forward
    ids = torch.randint(0, 1000, (1, 40), device="cuda")
    eng.prefill(ids[0, :32])
    base, n = torch.zeros(1, dtype=torch.long, device="cuda"), torch.full((1,), 32, device="cuda")
    compiled, aux_c = (x.clone() for x in eng.rows_forward(ids[:, 32:], base, n))
    slots = torch.arange(32, 40, device="cuda")
    eager, aux_e = eng._forward(ids[:, 32:], slots[None], slots[None], eng.causal_mask(32, 8)[None, None])
    assert torch.allclose(compiled, eager, atol=1e-4) and torch.allclose(aux_c, aux_e, atol=1e-4)
    prop = DrafterProposer(drafter, Sampling(), 512, mode="chain", depth=7, compile=True)
    prop.graph()
    for q in load_questions("mt_bench", 4):
        p = turn_prompt(target.tokenizer, q.turns[:1], [])
        assert (
            spec_generate(eng, prop, p, 64, set(), Sampling()).tokens
            == plain_generate(eng, p, 64, set(), Sampling()).tokens
        )


@pytest.mark.parametrize("mode", ["chain", "tree"])
def test_graphed_batch_equals_each_alone(target, mode):
    """Four MT-bench prompts in one batch of rows (graphs, compiled drafter step): every row's
    speculative and plain answer is the row's plain answer alone."""
    from draftsmith.evaluate.decode import decode

    drafter = random_drafter(target.model, 32000)
    prompts = [turn_prompt(target.tokenizer, q.turns[:1], []) for q in load_questions("mt_bench", 4)]
    alone = TargetEngine(target.model, drafter.config.aux_layer_ids, 512)
    alone.graph_rows(1)
    ref = [plain_generate(alone, p, 64, set(), Sampling()).tokens for p in prompts]
    eng = TargetEngine(target.model, drafter.config.aux_layer_ids, 512, batch=4)
    prop = DrafterProposer(
        drafter, Sampling(), 512, mode=mode, depth=7, top_k=10, total_tokens=60, compile=True, batch=4
    )
    eng.graph_rows(1)
    eng.graph_rows(prop.size + 1)
    eng.graph_compact(prop.path_len)
    prop.graph()
    assert [t.tokens for t in decode(eng, prompts, 64, set(), Sampling(), prop)] == ref
    assert [t.tokens for t in decode(eng, prompts, 64, set(), Sampling())] == ref


def test_graphed_sampled_chain_draws_as_eager(target):
    """A sampled chain (temperature 1) runs its whole cycle in one CUDA graph, the noise of its
    draws staged before each replay: from the same seed it emits the same tokens, with the same
    accepted counts, as the same proposer without graphs."""
    drafter = random_drafter(target.model, 32000)
    eng = TargetEngine(target.model, drafter.config.aux_layer_ids, 512)
    eng.graph_rows(1)
    eng.graph_rows(8)
    prompt = turn_prompt(target.tokenizer, load_questions("mt_bench", 1)[0].turns[:1], [])
    runs = []
    for graphed in (True, False):
        sampling = Sampling(temperature=1.0, seed=0)
        prop = DrafterProposer(drafter, sampling, 512, mode="chain", depth=7)
        if graphed:
            prop.graph()
            assert prop.cycle is not None
        runs.append(spec_generate(eng, prop, prompt, 64, set(), sampling))
    assert runs[0].tokens == runs[1].tokens and runs[0].accepts == runs[1].accepts
    assert len(set(runs[0].tokens)) > 8  # sampled, not one token repeated


@pytest.mark.parametrize("compile", [False, True])
def test_graphed_adaptive_chain_equals_plain_and_stops_as_eager(target, compile):
    """eval --stop-below: the adaptive chain's head and each further step as CUDA graphs (compiled
    drafter step or not) and its look-ahead (each step queued before the previous one's go is read
    back through pinned memory), a batch of 4 rows: every row's answer is its plain answer, and the
    drafted lengths are those of the same proposer without graphs or look-ahead. The drafter's head is sharpened
    so that its confidence spans the threshold (a random one stops after its first draft)."""
    from draftsmith.evaluate.decode import decode

    drafter = random_drafter(target.model, 32000)
    with torch.no_grad():
        drafter.lm_head.weight.mul_(10)  # on the embedded default: stops after 2 to 7 drafts
    prompts = [turn_prompt(target.tokenizer, q.turns[:1], []) for q in load_questions("mt_bench", 4)]
    eng = TargetEngine(target.model, drafter.config.aux_layer_ids, 512, batch=4)
    for t in range(1, 9):
        eng.graph_rows(t)
    plain = [t.tokens for t in decode(eng, prompts, 64, set(), Sampling())]
    runs = []
    for graphed in (True, False):
        prop = DrafterProposer(
            drafter, Sampling(), 512, depth=7, batch=4, stop_below=0.3, compile=compile and graphed, lookahead=graphed
        )
        if graphed:
            prop.graph()
            assert prop.cycle is not None and len(prop.walk_graphs) == 6 and prop.go_host is not None
        runs.append(decode(eng, prompts, 64, set(), Sampling(), prop))
    assert [t.tokens for t in runs[0]] == plain == [t.tokens for t in runs[1]]
    drafted = [d for t in runs[0] for d in t.drafted]
    assert len(set(drafted)) > 1, drafted  # the threshold was crossed at several depths
    if not compile:  # the same kernels with and without graphs: the same stops
        assert [t.drafted for t in runs[0]] == [t.drafted for t in runs[1]]
