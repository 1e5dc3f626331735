"""P-EAGLE (draft/peagle.py): the TTT unroll of a parallel drafter is vLLM's one forward over the
context and K-1 placeholder slots (plain causal attention), and eval's proposer drafts what both
predict, for drafters of one decoder layer and of several."""

import pytest
import torch

from draftsmith.draft.model import Eagle3Drafter
from draftsmith.evaluate.proposer import DrafterProposer
from draftsmith.runtime.sampling import Sampling
from draftsmith.train.ttt import doc_and_positions, unroll
from tests.helpers import tiny_ttt_drafter

K = 4
PTD = 7


def tiny_peagle(seed: int = 0, num_layers: int = 1, **options) -> Eagle3Drafter:
    return tiny_ttt_drafter(seed, num_layers, method="peagle", ptd_token_id=PTD, **options).double().eval()


def unroll_logits(model, aux, prompt, steps: int) -> list[torch.Tensor]:
    """The unroll's draft logits [Vd] at t = n-1 for steps 0..steps-1 (later tokens: zeros, unread)."""
    n = aux.shape[1]
    ids = torch.cat([prompt, torch.zeros(1, steps - 1, dtype=torch.long)], dim=1)  # [1, n+steps]
    aux_all = torch.cat([aux, torch.zeros(1, steps, 72, dtype=torch.float64)], dim=1)
    doc, pos = doc_and_positions([n + steps], n + steps)
    with torch.no_grad():
        return [
            model.lm_head(model.norm(out[0, n - 1]))
            for _, out in unroll(model, model.project(aux_all), ids, pos[None], doc[None], steps)
        ]


def served_logits(model, aux, prompt, steps: int) -> torch.Tensor:
    """vLLM's parallel-drafting forward: the context (aux at t, token t+1, position t), then
    steps-1 slots (project(mask_hidden), the placeholder token, positions n..), causal attention;
    the logits at n-1.. [steps, Vd]."""
    n = aux.shape[1]
    slot = model.project(model.mask_hidden[None])  # [1, H]
    hidden = torch.cat([model.project(aux)[0], slot.expand(steps - 1, -1)])[None]  # [1, n+steps-1, H]
    ids = torch.cat([prompt[0, 1:], torch.full((steps - 1,), PTD)])[None]  # [1, n+steps-1]
    pos = torch.arange(n + steps - 1)[None]
    with torch.no_grad():
        logits, _ = model(hidden, ids, pos)
    return logits[0, n - 1 :]


def example(seed: int, n: int):
    g = torch.Generator().manual_seed(seed)
    aux = torch.randn(1, n, 72, generator=g, dtype=torch.float64)  # [1, n, n_aux*H_t]
    prompt = torch.randint(0, 20, (1, n + 1), generator=g)  # x_0..x_n
    return aux, prompt


@pytest.mark.parametrize("num_layers", [1, 2])
def test_the_unroll_is_vllms_parallel_forward(num_layers):
    model = tiny_peagle(seed=1, num_layers=num_layers, fc_norm=True)
    for seed, n in enumerate((9, 5, 1)):
        aux, prompt = example(seed, n)
        trained = torch.stack(unroll_logits(model, aux, prompt, K))  # [K, Vd]
        torch.testing.assert_close(trained, served_logits(model, aux, prompt, K), rtol=1e-9, atol=1e-9)


def test_the_unrolls_parallel_steps_read_no_later_token():
    model = tiny_peagle(seed=2)
    aux, prompt = example(0, 6)
    n = aux.shape[1]
    ids = torch.cat([prompt, torch.randint(0, 50, (1, K))], dim=1)
    other = ids.clone()
    other[0, n + 1 :] = (other[0, n + 1 :] + 1) % 50
    doc, pos = doc_and_positions([n + K + 1], n + K + 1)
    aux_all = torch.cat([aux, torch.zeros(1, K + 1, 72, dtype=torch.float64)], dim=1)
    with torch.no_grad():
        a = [out[0, n - 1] for _, out in unroll(model, model.project(aux_all), ids, pos[None], doc[None], K)]
        b = [out[0, n - 1] for _, out in unroll(model, model.project(aux_all), other, pos[None], doc[None], K)]
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y)


@pytest.mark.slow
@pytest.mark.parametrize("num_layers", [1, 2])
def test_the_proposers_parallel_draft_is_the_unrolls(num_layers):
    model = tiny_peagle(seed=3, num_layers=num_layers)
    seen = set()
    for seed, n in enumerate((9, 5, 12, 7, 3, 10)):
        aux, prompt = example(seed, n)
        prop = DrafterProposer(model, Sampling(), 64, depth=K)
        prop.observe_prompt(aux, prompt[:, 1:], torch.zeros(1, dtype=torch.long))
        drafts = prop.propose().tokens[0].tolist()
        trained = [int(model.to_target_ids(lg.argmax())) for lg in unroll_logits(model, aux, prompt, K)]
        assert drafts == trained, (drafts, trained)
        seen.update(drafts)
    assert len(seen) > 3


def as_peagle(drafter: Eagle3Drafter) -> Eagle3Drafter:
    """The same drafter, P-EAGLE: the method set and a random `mask_hidden`."""
    drafter.config.method, drafter.config.ptd_token_id = "peagle", PTD
    w = drafter.fc.weight
    drafter.mask_hidden = torch.nn.Parameter(torch.randn(w.shape[1], generator=torch.Generator().manual_seed(9)).to(w))
    return drafter


def test_static_step_of_a_peagle_drafter_matches_the_compacted_step_and_traces_as_one_graph():
    """--compile-step's static form (compiled on CUDA) gives the default step's loss, counts and
    gradients, mask_hidden's too, for a P-EAGLE drafter, with no host sync (one dynamo graph)."""
    from draftsmith.runtime.head import OutputHead
    from draftsmith.train.loss import STAT_KEYS, TTTObjective
    from tests.unit.test_ttt_loss import grads, static_batch, teacher_head
    from tests.unit.test_ttt_loss import tiny_drafter as loss_drafter

    drafter = as_peagle(loss_drafter())
    head = OutputHead(teacher_head(drafter))
    out = {}
    for static in (False, True):
        objective = TTTObjective(drafter, head, ttt=3, backend="eager", chunk=5, static=static, step_decay=1.0)
        loss, stats = objective(**static_batch())
        loss.backward()
        out[static] = loss, stats, grads(drafter)
    (loss, stats, g), (s_loss, s_stats, s_g) = out[False], out[True]
    torch.testing.assert_close(s_loss, loss, rtol=1e-5, atol=1e-6)
    for key in STAT_KEYS:
        torch.testing.assert_close(s_stats[key], stats[key], rtol=1e-5, atol=1e-5, msg=key)
    assert "mask_hidden" in g and g["mask_hidden"].abs().sum() > 0
    for name in g:
        torch.testing.assert_close(s_g[name], g[name], rtol=1e-5, atol=1e-6, msg=name)
    objective = TTTObjective(drafter, head, ttt=3, backend="eager", chunk=20, static=True)
    explained = torch._dynamo.explain(objective.static_step)(**static_batch())
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons


def test_an_engine_folder_of_a_parallel_drafter_needs_its_placeholder():
    """read_method: a speculators `peagle` or an EAGLE-3 config with a placeholder token is P-EAGLE,
    and must come with mask_hidden; mask_hidden without a token is refused as vLLM refuses it."""
    from draftsmith.draft.peagle import read_method
    from draftsmith.errors import UserError

    assert read_method({}, False, False, "f") == {"method": "eagle3"}
    assert read_method({"pard_token": 3, "ptd_token_id": 3}, False, True, "f") == {
        "method": "peagle",
        "ptd_token_id": 3,
    }
    assert read_method({"speculators_model_type": "peagle", "mask_token_id": 5}, True, True, "f")["ptd_token_id"] == 5
    with pytest.raises(UserError, match="without mask_hidden"):
        read_method({"ptd_token_id": 3}, False, False, "f")
    with pytest.raises(UserError, match="placeholder token"):
        read_method({}, False, True, "f")
