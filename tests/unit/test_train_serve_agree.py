"""Training and serving run one drafter: the chain that eval's proposer drafts (KV cache, draft
slots) is the chain that the TTT unroll, fed those drafts as its known tokens, predicts at the
prompt's last position, step by step; for a drafter of one decoder layer and of several."""

import pytest
import torch

from draftsmith.evaluate.proposer import DrafterProposer
from draftsmith.runtime.sampling import Sampling
from draftsmith.train.ttt import doc_and_positions, unroll
from tests.unit.test_ttt import tiny_drafter

K = 4


@pytest.mark.parametrize("num_layers", [1, 2, 3])
def test_the_proposers_chain_is_the_ttt_unrolls(num_layers):
    model = tiny_drafter(seed=3, num_layers=num_layers).eval()
    chains = [chain_pair(model, n, seed) for seed, n in enumerate((9, 5, 12, 7, 3, 10))]
    assert all(served == trained for served, trained in chains), chains
    assert len({token for served, _ in chains for token in served}) > 3  # the chains are not one repeated token


def chain_pair(model, n: int, seed: int) -> tuple[list[int], list[int]]:
    """For a prompt of n positions (x_n: the target's token after it, the cycle's root): the K
    target ids the proposer drafts, and those the TTT unroll predicts at t = n-1, where step k
    reads token t+1+k (x_n, then the drafts d_1..d_{K-1}) and predicts d_{k+1}."""
    g = torch.Generator().manual_seed(seed)
    aux = torch.randn(1, n, 72, generator=g, dtype=torch.float64)  # [1, n, n_aux*H_t]
    prompt = torch.randint(0, 20, (1, n + 1), generator=g)  # x_0..x_n
    prop = DrafterProposer(model, Sampling(), 64, mode="chain", depth=K)
    prop.observe_prompt(aux, prompt[:, 1:], torch.zeros(1, dtype=torch.long))
    drafts = prop.propose().tokens  # [1, K]
    ids = torch.cat([prompt, drafts[:, :-1]], dim=1)  # [1, n+K]
    aux_all = torch.cat([aux, torch.zeros(1, K, 72, dtype=torch.float64)], dim=1)  # later positions: unseen at t
    doc, pos = doc_and_positions([n + K], n + K)
    with torch.no_grad():
        outs = [out for _, out in unroll(model, model.project(aux_all), ids, pos[None], doc[None], K)]
    predicted = [int(model.to_target_ids(model.lm_head(model.norm(out[0, n - 1])).argmax())) for out in outs]
    return drafts[0].tolist(), predicted
