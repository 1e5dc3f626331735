"""A P-EAGLE drafter in eval's engine (one drafter forward proposes K drafts): greedy
speculative output equals plain decoding (fp32, one row and a batch of rows that stop at other
times), and sampled speculative decoding keeps the target's distribution of the first two
tokens, the second verified against the parallel slot's own distribution (chi-square)."""

from __future__ import annotations

import pytest
import torch

from draftsmith.evaluate.decode import decode, plain_generate, spec_generate
from draftsmith.evaluate.proposer import DrafterProposer
from draftsmith.layers import default_aux_layers
from draftsmith.runtime.engine import TargetEngine
from draftsmith.runtime.sampling import Sampling, target_probs, verify_chain_sampled
from tests.helpers import V, random_drafter, tiny_vocab_drafter, tiny_vocab_llama
from tests.unit.test_spec_engine import engine_for
from tests.unit.test_spec_sampling import ROWS, chi2


@pytest.mark.slow
@pytest.mark.parametrize("depth", [1, 3, 5])
def test_greedy_peagle_equals_plain(tiny_model, depth):
    eng = engine_for(tiny_model)
    drafter = random_drafter(tiny_model, draft_vocab_size=4000, stride=2, method="peagle")
    prop = DrafterProposer(drafter, Sampling(), eng.max_len, mode="chain", depth=depth)
    for seed in range(3):
        prompt = torch.randint(0, 1000, (8,), generator=torch.Generator().manual_seed(seed)).tolist()
        plain = plain_generate(eng, prompt, 20, set(), Sampling())
        spec = spec_generate(eng, prop, prompt, 20, set(), Sampling())
        assert spec.tokens == plain.tokens
        assert 1 <= len(spec.accepts) <= len(spec.tokens)


@pytest.mark.slow
def test_greedy_peagle_batch_rows_decode_as_each_alone(tiny_model):
    drafter = random_drafter(tiny_model, draft_vocab_size=4000, stride=2, method="peagle")
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 1000, (n,), generator=gen).tolist() for n in (8, 3, 12)]
    free = plain_generate(engine_for(tiny_model), prompts[1], 20, set(), Sampling()).tokens
    stop = {next(t for i, t in enumerate(free) if i >= 3 and t not in free[:i])}
    alone = [plain_generate(engine_for(tiny_model), p, 20, stop, Sampling()).tokens for p in prompts]
    eng = TargetEngine(tiny_model, default_aux_layers(2), 256, batch=3)
    prop = DrafterProposer(drafter, Sampling(), 256, mode="chain", depth=3, batch=3)
    spec = decode(eng, prompts, 20, stop, Sampling(), prop)
    assert [t.tokens for t in spec] == alone
    assert 3 < len(alone[1]) < 20


def test_a_parallel_drafter_drafts_no_tree(tiny_model):
    drafter = random_drafter(tiny_model, method="peagle")
    with pytest.raises(AssertionError, match="chains"):
        DrafterProposer(drafter, Sampling(), 64, mode="tree", depth=3)


def first_two_emitted(n: int, residual: bool = True) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Counts [V, V] of the first two tokens after the root, from one verification of K=2
    parallel drafts per row (eval's engine, drafter and on-device verification; when only the
    correction is emitted, the second token is drawn from the target itself), their exact
    probabilities, and the share of rows whose second draft was accepted."""
    model = tiny_vocab_llama()
    eng = TargetEngine(model, [0, 1, 2], max_len=64, batch=ROWS)
    drafter = tiny_vocab_drafter(model)
    drafter.config.method = "peagle"
    drafter.mask_hidden = torch.nn.Parameter(torch.randn(drafter.fc.in_features))
    sampling = Sampling(temperature=1.0, seed=0, residual=residual)
    prop = DrafterProposer(drafter.eval(), sampling, 64, mode="chain", depth=2, batch=ROWS)
    prompt, root = [1, 5, 7, 3, 9], 4
    _, aux, ids, pad = eng.prefill_rows([prompt] * ROWS)
    roots = torch.full((ROWS, 1), root)
    prop.observe_prompt(aux, torch.cat([ids[:, 1:], roots], dim=1), pad)
    with torch.no_grad():
        p1 = target_probs(model(torch.tensor([prompt + [root]])).logits[0, -1], 1.0, 1.0)  # [V]
        p2 = torch.stack(
            [target_probs(model(torch.tensor([prompt + [root, t]])).logits[0, -1], 1.0, 1.0) for t in range(V)]
        )  # [V, V]: the second token given the first
    g = torch.Generator().manual_seed(5)
    counts, both, at = torch.zeros(V, V), 0, torch.full((ROWS,), len(prompt))
    for _ in range(n // ROWS):
        draft = prop.propose()
        logits, _ = eng.rows_forward(torch.cat([roots, draft.tokens], dim=1), pad, at)
        accepted, _, host = verify_chain_sampled(draft.tokens, draft.q, logits, sampling)
        for h in host:
            second = h[1] if len(h) > 1 else int(torch.multinomial(p2[h[0]], 1, generator=g))
            counts[h[0], second] += 1
        both += int((accepted == 2).sum())
    return counts, p1[:, None] * p2, both / n


@pytest.mark.slow
def test_peagle_speculative_sampling_keeps_the_targets_two_token_distribution():
    counts, ref, both = first_two_emitted(2400)
    assert both > 0.05, both  # the parallel slot's draft is accepted often enough to matter
    assert chi2(counts, ref) < 200.0  # df <= 143, p ~ 0.001 (141 measured)
    wrong, ref, _ = first_two_emitted(1600, residual=False)  # without the correction: 389 measured
    assert chi2(wrong, ref) > 300.0
