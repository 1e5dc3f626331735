"""GPU checks of a DFlash drafter in the eval engine (run with --run-gpu on a CUDA machine): its
cycle (the staged rows' context K/V, then the block forward and its draws) is captured in one
CUDA graph, graphed speculative greedy decoding equals graphed plain decoding (the tiny Llama,
fp32), at batch 1 and in a batch of rows, and a sampled block draws in its graph as it does
without one."""

from __future__ import annotations

import pytest

from draftsmith.evaluate.decode import decode, plain_generate, spec_generate
from draftsmith.evaluate.dflash_proposer import DFlashProposer
from draftsmith.runtime.engine import TargetEngine
from draftsmith.runtime.sampling import Sampling
from tests.helpers import random_dflash, random_prompts

pytestmark = pytest.mark.gpu


def graphed(model, drafter, batch: int, depth: int):
    eng = TargetEngine(model, drafter.config.aux_layer_ids, 512, batch=batch)
    prop = DFlashProposer(drafter, Sampling(), 512, depth, batch=batch)
    eng.graph_rows(1)
    eng.graph_rows(prop.size + 1)
    prop.graph()
    assert prop.graphed and prop.cycle is not None  # captured, not fallen back to eager
    return eng, prop


def test_graphed_dflash_spec_equals_plain(model):
    drafter = random_dflash(model, block_size=8)
    eng, prop = graphed(model, drafter, 1, depth=7)
    for p in random_prompts(4):
        assert (
            spec_generate(eng, prop, p, 48, set(), Sampling()).tokens
            == plain_generate(eng, p, 48, set(), Sampling()).tokens
        )


def test_graphed_dflash_batch_equals_each_alone(model):
    drafter = random_dflash(model, block_size=8)
    alone = TargetEngine(model, drafter.config.aux_layer_ids, 512)
    alone.graph_rows(1)
    ref = [plain_generate(alone, p, 48, set(), Sampling()).tokens for p in random_prompts(4)]
    eng, prop = graphed(model, drafter, 4, depth=5)
    assert [t.tokens for t in decode(eng, random_prompts(4), 48, set(), Sampling(), prop)] == ref


def test_graphed_sampled_dflash_draws_as_eager(model):
    """A sampled block (temperature 1), its noise staged before each replay: from the same seed
    the graphed cycle emits the same tokens, with the same accepted counts, as the eager one."""
    drafter = random_dflash(model, block_size=8)
    eng = TargetEngine(model, drafter.config.aux_layer_ids, 512)
    eng.graph_rows(1)
    eng.graph_rows(8)
    runs = []
    for graph in (True, False):
        sampling = Sampling(temperature=1.0, seed=0)
        prop = DFlashProposer(drafter, sampling, 512, 7)
        if graph:
            prop.graph()
            assert prop.graphed
        runs.append(spec_generate(eng, prop, random_prompts(1)[0], 48, set(), sampling))
    assert runs[0].tokens == runs[1].tokens and runs[0].accepts == runs[1].accepts
    assert len(set(runs[0].tokens)) > 8  # sampled, not one token repeated
