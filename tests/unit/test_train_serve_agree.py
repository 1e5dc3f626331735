"""Training and serving run one drafter: the chain that eval's proposer drafts (KV cache, draft
slots) is the chain that the TTT unroll, fed those drafts as its known tokens, predicts at the
prompt's last position, step by step; and in a tree draft, each node's children are the best
tokens the unroll predicts along that node's own path (a node sees its ancestors, not its
siblings or cousins); for a drafter of one decoder layer and of several."""

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


def drafted(model, n: int, seed: int, **shape):
    """A random prompt of n positions with aux states (x_n: the target's token after it, the
    cycle's root), observed by a proposer of `shape` (mode, top_k, ...); returns its draft, the
    aux states [1, n, 72] and the prompt's ids [1, n+1]."""
    g = torch.Generator().manual_seed(seed)
    aux = torch.randn(1, n, 72, generator=g, dtype=torch.float64)  # [1, n, n_aux*H_t]
    prompt = torch.randint(0, 20, (1, n + 1), generator=g)  # x_0..x_n
    prop = DrafterProposer(model, Sampling(), 64, depth=K, **shape)
    prop.observe_prompt(aux, prompt[:, 1:], torch.zeros(1, dtype=torch.long))
    return prop.propose(), aux, prompt


def unrolled_logits(model, aux: torch.Tensor, prompt: torch.Tensor, known: list[int]) -> list[torch.Tensor]:
    """The TTT unroll's draft logits [Vd] at t = n-1, one per step k = 0..len(known): step k reads
    token t+1+k (x_n, then `known`, the drafts before it) and predicts the next draft."""
    n, steps = aux.shape[1], len(known) + 1
    ids = torch.cat([prompt, torch.tensor([known], dtype=torch.long)], dim=1)  # [1, n+steps]
    aux_all = torch.cat([aux, torch.zeros(1, steps, 72, dtype=torch.float64)], dim=1)  # later positions: unseen at t
    doc, pos = doc_and_positions([n + steps], n + steps)
    with torch.no_grad():
        return [
            model.lm_head(model.norm(out[0, n - 1]))
            for _, out in unroll(model, model.project(aux_all), ids, pos[None], doc[None], steps)
        ]


def chain_pair(model, n: int, seed: int) -> tuple[list[int], list[int]]:
    """The K target ids the proposer drafts, and those the TTT unroll predicts fed those drafts."""
    draft, aux, prompt = drafted(model, n, seed, mode="chain")
    drafts = draft.tokens[0].tolist()  # [K]
    return drafts, [
        int(model.to_target_ids(logits.argmax())) for logits in unrolled_logits(model, aux, prompt, drafts[:-1])
    ]


@pytest.mark.slow
@pytest.mark.parametrize("num_layers", [1, 2, 3])
def test_each_tree_nodes_children_are_the_ttt_unrolls_top_k(num_layers):
    """The tree eval drafts (each layer's attention masked to a node's own ancestors): every
    node's children are the best of what the TTT unroll, fed that node's path, predicts."""
    model = tiny_drafter(seed=3, num_layers=num_layers).eval()
    checked = sum(tree_check(model, n, seed) for seed, n in enumerate((9, 5, 12, 7, 3, 10)))
    assert checked >= 6 * 4  # nodes with children, over the six trees


def tree_check(model, n: int, seed: int, top_k: int = 3, total: int = 20) -> int:
    """Drafts a tree (depth K) after a prompt of n positions, asserts each expanded node's
    children against the unroll along its path, and returns how many nodes had children."""
    draft, aux, prompt = drafted(model, n, seed, mode="tree", top_k=top_k, total_tokens=total)
    tokens, parents = draft.tokens[0].tolist(), draft.parents[0].tolist()  # [N]; parent rows, 0 = root
    paths = {0: []}  # row -> its path of draft tokens from the root
    for i, (token, parent) in enumerate(zip(tokens, parents)):
        paths[i + 1] = paths[parent] + [token]
    expanded = 0
    for row, path in paths.items():
        children = {tokens[i] for i, p in enumerate(parents) if p == row}
        if not children:
            continue
        top = model.to_target_ids(unrolled_logits(model, aux, prompt, path)[-1].topk(top_k).indices).tolist()
        # the kept children of one node are its best: a prefix of its top-k (cumulative scores
        # differ from a sibling's only by the child's own log-prob)
        assert children == set(top[: len(children)]), (row, path, children, top)
        expanded += 1
    return expanded
