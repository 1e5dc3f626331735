"""Speculative sampling is lossless: on a tiny Llama with a 12-token vocab, the tokens emitted
by one verification step (chain and tree, random drafter) follow the target's own sampling
distribution; without the rejection-sampling correction they do not. Both are the on-device
verifications that `eval` runs: `verify_chain_sampled` and `tree_accept` (with the fused tree
draft: top-k, selection and ancestor mask on the device)."""

from __future__ import annotations

import pytest
import torch

from draftsmith.evaluate.proposer import DrafterProposer, tree_ancestors
from draftsmith.runtime.engine import TargetEngine
from draftsmith.runtime.sampling import Sampling, read_verified, target_probs, tree_accept, verify_chain_sampled
from tests.helpers import V, tiny_vocab_drafter, tiny_vocab_llama


def verify_as(
    mode: str, tokens: list[int], parents: list[int], logits: torch.Tensor, sampling: Sampling, q: torch.Tensor | None
) -> tuple[list[int], int]:
    """`verify_chain_sampled` or `tree_accept` on one row, as (accepted rows, next token)."""
    if mode == "chain":
        accepted, _, new = verify_chain_sampled(
            torch.tensor([tokens]), None if q is None else q[None], logits[None], sampling
        )
        return list(range(int(accepted[0]) + 1)), new[0][-1]
    depths = torch.zeros(len(parents) + 1, dtype=torch.long)
    for i, p in enumerate(parents):
        depths[i + 1] = depths[p] + 1
    depth = int(depths.max())
    anc = tree_ancestors(torch.tensor([parents]), depth)
    accepted, path, new = tree_accept(
        torch.tensor([tokens]), torch.tensor([parents]), depths[None, 1:], anc, logits[None], sampling, depth + 1
    )
    a = int(accepted[0])
    return path[0, : a + 1].tolist(), int(new[0, a])


CHI2_CRIT_DF11 = 31.26  # p = 0.001
ROWS = 8  # the rows of one batch, each an independent verification step from the same state


def first_emitted(
    mode: str, residual: bool, n: int, temperature: float, top_p: float
) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Counts of the first token emitted after the root by n independent verification steps
    (real engine, real drafter, as eval runs them: batches of ROWS rows drafted, verified on
    the target's tree-mask forward and accepted on the device), the target's distribution
    there, and the mean accepted length."""
    model = tiny_vocab_llama()
    eng = TargetEngine(model, [0, 1, 2], max_len=64, batch=ROWS)
    sampling = Sampling(temperature=temperature, top_p=top_p, seed=0, residual=residual)
    prop = DrafterProposer(
        tiny_vocab_drafter(model),
        sampling,
        64,
        mode=mode,
        depth=1 if mode == "chain" else 2,
        top_k=3,
        total_tokens=6,
        batch=ROWS,
    )
    prompt, root = [1, 5, 7, 3, 9], 4
    _, aux, ids, pad = eng.prefill_rows([prompt] * ROWS)
    roots = torch.full((ROWS, 1), root)
    prop.observe_prompt(aux, torch.cat([ids[:, 1:], roots], dim=1), pad)
    ref = target_probs(model(torch.tensor([prompt + [root]])).logits[0, -1], temperature, top_p)
    counts, accepted = torch.zeros(V), 0
    at = torch.full((ROWS,), len(prompt))
    for _ in range(n // ROWS):
        draft = prop.propose()
        rows = torch.cat([roots, draft.tokens], dim=1)  # [R, N+1]
        if mode == "chain":
            logits, _ = eng.rows_forward(rows, pad, at)
            a, new, host = verify_chain_sampled(draft.tokens, draft.q, logits, sampling)
        else:
            offsets = torch.cat([torch.zeros(ROWS, 1, dtype=torch.long), draft.depths], dim=1)
            logits, _ = eng.rows_forward(rows, pad, at, draft.anc, offsets)
            a, _, new = tree_accept(
                draft.tokens, draft.parents, draft.depths, draft.anc, logits, sampling, prop.path_len
            )
            a, new, host = read_verified(a, new)
        for h in host:
            counts[h[0]] += 1  # the first accepted draft, or the correction
        accepted += int(a.sum())
    return counts, ref.detach(), accepted / n


def markov_pairs(mode: str, residual: bool, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A fake target whose next-token distribution depends on the last token only (P [V, V])
    and a fake drafter (Q [V, V]): speculative decoding, step after step, until two tokens
    are out. Returns counts of the first two tokens [V, V] and their exact probabilities."""
    g = torch.Generator().manual_seed(0)
    v = 6
    P = torch.distributions.Dirichlet(torch.full((v,), 0.7)).sample((v,))
    Q = torch.distributions.Dirichlet(torch.full((v,), 0.7)).sample((v,))
    sampling = Sampling(temperature=1.0, seed=1, residual=residual)
    counts = torch.zeros(v, v)
    for _ in range(n):
        out, last = [], 0
        while len(out) < 2:
            if mode != "tree":  # K=3 drafts sampled from Q; adaptive: fewer once their joint probability is < 0.3
                tokens, prev, confidence = [], last, 1.0
                for _ in range(3):
                    draw = int(torch.multinomial(Q[prev], 1, generator=g))
                    tokens.append(draw)
                    confidence, prev = confidence * float(Q[prev, draw]), draw
                    if mode == "adaptive" and confidence < 0.3:
                        break
                qs = torch.stack([Q[t] for t in [last] + tokens[:-1]])  # [K, v]
                parents = list(range(len(tokens)))
            else:  # top-2 children of the root and of each child: 6 nodes
                c1 = Q[last].topk(2).indices.tolist()
                tokens = c1 + [t for c in c1 for t in Q[c].topk(2).indices.tolist()]
                parents, qs = [0, 0, 1, 1, 2, 2], None
            rows = [last] + tokens
            logits = P[rows].log()  # [N+1, v]
            path, nxt = verify_as("tree" if mode == "tree" else "chain", tokens, parents, logits, sampling, qs)
            out += [rows[r] for r in path[1:]] + [nxt]
            last = out[-1]
        counts[out[0], out[1]] += 1
    return counts, P[0][:, None] * P


def chi2(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's statistic; cells expected below 5 are pooled into one."""
    counts, expected = counts.flatten(), counts.sum() * probs.flatten()
    assert torch.all((expected > 0) | (counts == 0)), "a token the target never samples was emitted"
    small = expected < 5
    obs = torch.cat([counts[~small], counts[small].sum()[None]])
    exp = torch.cat([expected[~small], expected[small].sum()[None]])
    keep = exp > 0
    return float(((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum())


@pytest.mark.slow
@pytest.mark.parametrize(
    "mode,temperature,top_p", [("chain", 1.0, 1.0), ("tree", 1.0, 1.0), ("chain", 0.7, 0.9), ("tree", 0.7, 0.9)]
)
def test_speculative_sampling_matches_target(mode, temperature, top_p):
    counts, ref, mean_accept = first_emitted(mode, residual=True, n=2000, temperature=temperature, top_p=top_p)
    assert mean_accept > 0.2  # the drafts are accepted often enough for the test to mean something
    assert chi2(counts, ref) < CHI2_CRIT_DF11
    assert 0.5 * (counts / counts.sum() - ref).abs().sum() < 0.05


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["chain", "tree"])
def test_without_correction_the_distribution_is_wrong(mode):
    counts, ref, _ = first_emitted(mode, residual=False, n=2000, temperature=1.0, top_p=1.0)
    assert chi2(counts, ref) > 3 * CHI2_CRIT_DF11
    assert 0.5 * (counts / counts.sum() - ref).abs().sum() > 0.05


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["chain", "tree", "adaptive"])
def test_two_token_joint_distribution_over_several_steps(mode):
    """Deeper positions and consecutive steps: the first two tokens are jointly exact (also for
    an adaptive chain, whose length its own draws decide: `eval --stop-below`)."""
    counts, ref = markov_pairs(mode, residual=True, n=2500)
    assert chi2(counts, ref) < 66.6  # df <= 35, p <= 0.001
    wrong, _ = markov_pairs(mode, residual=False, n=2500)
    assert chi2(wrong, ref) > 2 * 66.6


@pytest.mark.slow
def test_sampled_chain_draws_follow_q_at_every_position():
    """The drafter's own draws in a sampled chain of K=3, proposed again and again from one
    state, as eval's CUDA graph replays the cycle with the noise staged before it: every
    proposal draws afresh, and the token at each position follows the distribution q that the
    proposal reports for it, given the tokens before it (chi-square; a reused or shared noise
    slice would fail)."""
    model = tiny_vocab_llama()
    eng = TargetEngine(model, [0, 1, 2], max_len=64, batch=ROWS)
    prop = DrafterProposer(
        tiny_vocab_drafter(model), Sampling(temperature=1.0, seed=0), 64, mode="chain", depth=3, batch=ROWS
    )
    prompt, root = [1, 5, 7, 3, 9], 4
    _, aux, ids, pad = eng.prefill_rows([prompt] * ROWS)
    prop.observe_prompt(aux, torch.cat([ids[:, 1:], torch.full((ROWS, 1), root)], dim=1), pad)
    drafts = [prop.propose() for _ in range(500)]
    tokens = torch.cat([d.tokens for d in drafts])  # [4000, 3]
    q = torch.cat([d.q for d in drafts])  # [4000, 3, V]
    for i in range(3):
        prefix = tokens[:, :i]
        if i:  # condition on the most frequent prefix: q at position i is then one distribution
            values, counts = prefix.unique(dim=0, return_counts=True)
            rows = (prefix == values[counts.argmax()]).all(1)
        else:
            rows = torch.ones(len(tokens), dtype=torch.bool)
        assert torch.allclose(q[rows, i], q[rows, i][:1].expand_as(q[rows, i]))
        assert rows.sum() > 300
        assert chi2(torch.bincount(tokens[rows, i], minlength=V).float(), q[rows, i][0]) < CHI2_CRIT_DF11


def test_verify_greedy_follows_argmax_through_tree():
    logits = torch.full((5, V), -10.0)
    logits[0, 3] = logits[2, 7] = logits[3, 1] = logits[4, 2] = 0.0  # argmax per row
    tokens, parents = [5, 3, 7, 9], [0, 0, 2, 3]  # rows 1,2 under root; 3 under 2; 4 under 3
    path, bonus = verify_as("tree", tokens, parents, logits, Sampling(), None)
    assert path == [0, 2, 3] and bonus == 1


@pytest.mark.parametrize("mode", ["chain", "tree"])
def test_sampled_generation_runs_to_length(mode):
    """The full loop with sampling: drafts are accepted, KV compaction keeps going, stop at length."""
    from draftsmith.evaluate.decode import spec_generate

    model = tiny_vocab_llama()
    eng = TargetEngine(model, [0, 1, 2], max_len=64)
    sampling = Sampling(temperature=1.0, seed=3)
    prop = DrafterProposer(tiny_vocab_drafter(model), sampling, 64, mode=mode, depth=3, top_k=3, total_tokens=6)
    out = spec_generate(eng, prop, [1, 5, 7, 3, 9], 30, set(), sampling)
    assert len(out.tokens) == 30 and all(0 <= t < V for t in out.tokens)
    assert sum(out.accepts) > 0 and len(out.accepts) < 30


def test_target_probs_cuts_top_k_before_top_p():
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0]])
    two = target_probs(logits, 1.0, 1.0, top_k=2)
    assert torch.allclose(two, torch.tensor([[*torch.softmax(torch.tensor([3.0, 2.0]), -1), 0.0, 0.0]]))
    # the nucleus is taken on the renormalised top-k: 0.73 of the two reaches top_p 0.7 alone
    assert torch.equal(target_probs(logits, 1.0, 0.7, top_k=2), torch.tensor([[1.0, 0.0, 0.0, 0.0]]))
    assert torch.equal(target_probs(logits, 1.0, 1.0, top_k=0), torch.softmax(logits, -1))
