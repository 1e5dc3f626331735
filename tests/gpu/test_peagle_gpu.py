"""GPU checks of a P-EAGLE drafter in the eval engine (run with --run-gpu on a CUDA machine): its
cycle (step 0, then the K-1 parallel slots in one step) compiles and is captured in one CUDA
graph, and graphed speculative decoding equals graphed plain decoding (the tiny Llama, fp32), at
batch 1 and in a batch of rows."""

from __future__ import annotations

import pytest

from draftsmith.evaluate.decode import decode, plain_generate, spec_generate
from draftsmith.evaluate.proposer import DrafterProposer
from draftsmith.runtime.engine import TargetEngine
from draftsmith.runtime.sampling import Sampling
from tests.helpers import random_drafter, random_prompts

pytestmark = pytest.mark.gpu


def graphed(model, drafter, batch: int, depth: int = 7):
    eng = TargetEngine(model, drafter.config.aux_layer_ids, 512, batch=batch)
    prop = DrafterProposer(drafter, Sampling(), 512, mode="chain", depth=depth, compile=True, batch=batch)
    eng.graph_rows(1)
    eng.graph_rows(prop.size + 1)
    eng.graph_compact(prop.path_len)
    prop.graph()
    assert prop.compiled and prop.cycle is not None  # the compiled step inside the captured cycle
    return eng, prop


def test_graphed_peagle_spec_equals_plain(model):
    drafter = random_drafter(model, 4000, stride=2, method="peagle")
    eng, prop = graphed(model, drafter, 1)
    for p in random_prompts(4):
        assert (
            spec_generate(eng, prop, p, 48, set(), Sampling()).tokens
            == plain_generate(eng, p, 48, set(), Sampling()).tokens
        )


def test_graphed_peagle_batch_equals_each_alone(model):
    drafter = random_drafter(model, 4000, stride=2, method="peagle")
    alone = TargetEngine(model, drafter.config.aux_layer_ids, 512)
    alone.graph_rows(1)
    ref = [plain_generate(alone, p, 48, set(), Sampling()).tokens for p in random_prompts(4)]
    eng, prop = graphed(model, drafter, 4, depth=5)
    assert [t.tokens for t in decode(eng, random_prompts(4), 48, set(), Sampling(), prop)] == ref
