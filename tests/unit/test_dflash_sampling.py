"""Speculative sampling with a DFlash drafter is lossless: on the 12-token tiny Llama of
test_spec_sampling.py, the first token emitted by a verification step after a DFlash block
(its K drafts each drawn from its own slot's distribution, verified as a chain) follows the
target's sampling distribution; without the rejection-sampling correction it does not; and
each slot's draws follow the distribution the proposal reports for it (chi-square)."""

from __future__ import annotations

import pytest
import torch

from draftsmith.draft.dflash import DFlashConfig, DFlashDrafter
from draftsmith.evaluate.dflash_proposer import DFlashProposer
from draftsmith.runtime.engine import TargetEngine
from draftsmith.runtime.sampling import Sampling, target_probs, verify_chain_sampled
from tests.helpers import V, tiny_vocab_llama
from tests.unit.test_spec_sampling import CHI2_CRIT_DF11, ROWS, chi2

PROMPT, ROOT = [1, 5, 7, 3, 9], 4


def tiny_vocab_dflash(model, seed: int = 1) -> DFlashDrafter:
    """A block-of-3 DFlash drafter for `tiny_vocab_llama`: a draft vocab of 8 of its 12 ids,
    mask token 11 (outside it), peaked logits."""
    torch.manual_seed(seed)
    cfg = DFlashConfig.from_target(model.config, 8, [0, 1, 2], mask_token_id=11, block_size=3)
    drafter = DFlashDrafter(cfg)
    drafter.load_target_embeddings(model.get_input_embeddings().weight)
    with torch.no_grad():
        drafter.lm_head.weight.mul_(3)
    d2t = torch.tensor([0, 0, 1, 1, 2, 2, 3, 4])
    drafter.set_vocab(d2t, torch.zeros(V, dtype=torch.bool).index_fill_(0, torch.arange(8) + d2t, True))
    return drafter.eval()


def setup(temperature: float, top_p: float, residual: bool = True):
    model = tiny_vocab_llama()
    eng = TargetEngine(model, [0, 1, 2], max_len=64, batch=ROWS)
    sampling = Sampling(temperature=temperature, top_p=top_p, seed=0, residual=residual)
    prop = DFlashProposer(tiny_vocab_dflash(model), sampling, 64, depth=2, batch=ROWS)
    _, aux, ids, pad = eng.prefill_rows([PROMPT] * ROWS)
    prop.observe_prompt(aux, torch.cat([ids[:, 1:], torch.full((ROWS, 1), ROOT)], dim=1), pad)
    return model, eng, sampling, prop, pad


def first_emitted(residual: bool, n: int, temperature: float, top_p: float):
    model, eng, sampling, prop, pad = setup(temperature, top_p, residual)
    ref = target_probs(model(torch.tensor([PROMPT + [ROOT]])).logits[0, -1], temperature, top_p)
    counts, accepted = torch.zeros(V), 0
    roots, at = torch.full((ROWS, 1), ROOT), torch.full((ROWS,), len(PROMPT))
    for _ in range(n // ROWS):
        draft = prop.propose()
        logits, _ = eng.rows_forward(torch.cat([roots, draft.tokens], dim=1), pad, at)
        a, _, host = verify_chain_sampled(draft.tokens, draft.q, logits, sampling)
        for h in host:
            counts[h[0]] += 1  # the first accepted draft, or the correction
        accepted += int(a.sum())
    return counts, ref.detach(), accepted / n


@pytest.mark.slow
@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 0.9)])
def test_dflash_speculative_sampling_matches_target(temperature, top_p):
    counts, ref, mean_accept = first_emitted(residual=True, n=2000, temperature=temperature, top_p=top_p)
    assert mean_accept > 0.2  # the drafts are accepted often enough for the test to mean something
    assert chi2(counts, ref) < CHI2_CRIT_DF11
    assert 0.5 * (counts / counts.sum() - ref).abs().sum() < 0.05


@pytest.mark.slow
def test_dflash_without_correction_the_distribution_is_wrong():
    counts, ref, _ = first_emitted(residual=False, n=2000, temperature=1.0, top_p=1.0)
    assert chi2(counts, ref) > 3 * CHI2_CRIT_DF11


@pytest.mark.slow
def test_dflash_draws_follow_q_at_every_slot():
    """Every proposal draws afresh, and slot j's token follows the q the proposal reports for it."""
    _, _, _, prop, _ = setup(1.0, 1.0)
    drafts = [prop.propose() for _ in range(400)]
    tokens = torch.cat([d.tokens for d in drafts])  # [3200, 2]
    q = torch.cat([d.q for d in drafts])  # [3200, 2, V]
    for j in range(2):
        assert torch.allclose(q[:, j], q[:1, j].expand_as(q[:, j]))  # one state: one distribution per slot
        assert chi2(torch.bincount(tokens[:, j], minlength=V).float(), q[0, j]) < CHI2_CRIT_DF11
