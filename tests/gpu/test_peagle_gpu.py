"""GPU checks of a P-EAGLE drafter in the eval engine (run with --run-gpu on a CUDA machine): its
cycle (step 0, then the K-1 parallel slots in one step) compiles and is captured in one CUDA
graph, and graphed speculative decoding equals graphed plain decoding on the embedded default
(fp32), at batch 1 and in a batch of rows."""

from __future__ import annotations

import pytest

from draftsmith.evaluate.decode import decode, plain_generate, spec_generate
from draftsmith.evaluate.proposer import DrafterProposer
from draftsmith.evaluate.questions import load_questions, turn_prompt
from draftsmith.runtime.engine import TargetEngine
from draftsmith.runtime.sampling import Sampling
from tests.gpu.test_eval_gpu import target  # noqa: F401  (the module's target fixture)
from tests.helpers import random_drafter

pytestmark = pytest.mark.gpu


def test_graphed_peagle_spec_equals_plain(target):  # noqa: F811
    drafter = random_drafter(target.model, 32000, method="peagle")
    eng = TargetEngine(target.model, drafter.config.aux_layer_ids, 512)
    prop = DrafterProposer(drafter, Sampling(), 512, mode="chain", depth=7, compile=True)
    eng.graph_rows(1)
    eng.graph_rows(prop.size + 1)
    eng.graph_compact(prop.path_len)
    prop.graph()
    assert prop.compiled and prop.cycle is not None  # compiled, and captured in a graph
    for q in load_questions("mt_bench", 4):
        p = turn_prompt(target.tokenizer, q.turns[:1], [])
        assert (
            spec_generate(eng, prop, p, 64, set(), Sampling()).tokens
            == plain_generate(eng, p, 64, set(), Sampling()).tokens
        )


def test_graphed_peagle_batch_equals_each_alone(target):  # noqa: F811
    drafter = random_drafter(target.model, 32000, method="peagle")
    prompts = [turn_prompt(target.tokenizer, q.turns[:1], []) for q in load_questions("mt_bench", 4)]
    alone = TargetEngine(target.model, drafter.config.aux_layer_ids, 512)
    alone.graph_rows(1)
    ref = [plain_generate(alone, p, 64, set(), Sampling()).tokens for p in prompts]
    eng = TargetEngine(target.model, drafter.config.aux_layer_ids, 512, batch=4)
    prop = DrafterProposer(drafter, Sampling(), 512, mode="chain", depth=7, compile=True, batch=4)
    eng.graph_rows(1)
    eng.graph_rows(prop.size + 1)
    eng.graph_compact(prop.path_len)
    prop.graph()
    assert [t.tokens for t in decode(eng, prompts, 64, set(), Sampling(), prop)] == ref
