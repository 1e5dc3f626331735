"""TTT attention mask, positions and packing against a slow, obviously-correct reference:
each sample unrolled on its own, with an explicit loop over steps and queries and an explicit
list of the keys each query may see."""

from __future__ import annotations

import math

import pytest
import torch

from draftsmith.draft.model import Eagle3Drafter, causal_attend
from draftsmith.train.ttt import crop_keys, doc_and_positions, ttt_mask_mod, unroll
from tests.helpers import tiny_ttt_drafter

K = 3


def tiny_drafter(seed: int = 0, num_layers: int = 1) -> Eagle3Drafter:
    return tiny_ttt_drafter(seed, num_layers).double()


class ExplicitAttend:
    """One query at a time: the keys of query t at step k are step-0 keys at s <= t and the
    step-j keys (1 <= j <= k) at t, listed one by one."""

    def __init__(self) -> None:
        self.keys, self.values = [], []

    def __call__(self, q, k, v):  # q [1, nh, T, hd]; k, v [1, nkv, T, hd]
        self.keys.append(k)
        self.values.append(v)
        step = len(self.keys) - 1
        nh, T, hd = q.shape[1], q.shape[2], q.shape[3]
        rep = nh // k.shape[1]
        out = torch.zeros_like(q)
        for h in range(nh):
            for t in range(T):
                ks = [self.keys[0][0, h // rep, s] for s in range(t + 1)] + [
                    self.keys[j][0, h // rep, t] for j in range(1, step + 1)
                ]
                vs = [self.values[0][0, h // rep, s] for s in range(t + 1)] + [
                    self.values[j][0, h // rep, t] for j in range(1, step + 1)
                ]
                scores = torch.stack([q[0, h, t] @ key for key in ks]) / math.sqrt(hd)
                w = torch.softmax(scores, dim=0)
                out[0, h, t] = sum(wi * vi for wi, vi in zip(w, vs))
        return out


def reference_logits(model, aux, ids):
    """One sample [T]: step k feeds token t+1+k (or 0 past the end) at position t+k, through the
    first layer (embedding and hidden state) and then each later layer, each with its own keys."""
    T = ids.shape[0]
    attends = [ExplicitAttend() for _ in range(model.config.num_layers)]
    hidden = model.project(aux[None])
    logits = []
    for k in range(K):
        ids_k = torch.zeros(T, dtype=torch.long)
        ids_k[: max(T - 1 - k, 0)] = ids[1 + k :]
        pos_k = torch.arange(T)[None] + k
        embeds = model.embed_tokens(ids_k[None]).to(hidden.dtype)
        hidden = model.midlayer(embeds, hidden, pos_k, attends[0])
        for layer, attend in zip(model.extra_layers, attends[1:]):
            hidden = layer(hidden, pos_k, attend)
        logits.append(model.lm_head(model.norm(hidden))[0])
    return logits


@pytest.mark.slow
@pytest.mark.parametrize("num_layers", [1, 2])
@pytest.mark.parametrize("backend", ["eager", "flex-eager"])
def test_packed_ttt_matches_explicit_reference(backend, num_layers):
    model = tiny_drafter(num_layers=num_layers)
    lengths = [7, 5, 9]
    total = sum(lengths) + 3  # trailing padding
    torch.manual_seed(1)
    aux = torch.randn(total, 72, dtype=torch.float64)
    ids = torch.randint(0, 50, (total,))
    doc, pos = doc_and_positions(lengths, total)
    with torch.no_grad():  # flex_attention has no CPU backward; the forward is what is checked
        hidden0 = model.project(aux[None])
        steps = unroll(model, hidden0, ids[None], pos[None], doc[None], K, backend)
        packed = [model.lm_head(model.norm(out))[0] for _, out in steps]
    start = 0
    checked = 0
    for n in lengths:
        with torch.no_grad():
            ref = reference_logits(model, aux[start : start + n], ids[start : start + n])
        for k in range(K):
            m = n - 1 - k  # positions whose input token t+1+k is inside the sample
            torch.testing.assert_close(packed[k][start : start + m], ref[k][:m], rtol=1e-9, atol=1e-9)
            checked += m
        start += n
    assert checked > 0


@pytest.mark.parametrize("num_layers", [1, 2])
def test_step0_is_plain_causal_attention(num_layers):
    model = tiny_drafter(num_layers=num_layers)
    T = 6
    aux = torch.randn(1, T, 72, dtype=torch.float64)
    ids = torch.randint(0, 50, (1, T))
    doc, pos = doc_and_positions([T], T)
    _, out = next(unroll(model, model.project(aux), ids, pos[None], doc[None], 1))
    ids1 = torch.cat([ids[:, 1:], torch.zeros(1, 1, dtype=torch.long)], 1)
    _, plain = model(model.project(aux), ids1, pos[None], causal_attend)
    torch.testing.assert_close(out, plain)


def test_later_steps_differ_from_step0():
    """A mask that ignored the per-step keys would make steps identical given equal inputs."""
    model = tiny_drafter()
    T = 5
    aux = torch.randn(1, T, 72, dtype=torch.float64)
    ids = torch.full((1, T), 3)
    doc, pos = doc_and_positions([T], T)
    outs = [o for _, o in unroll(model, model.project(aux), ids, pos[None], doc[None], 2)]
    assert not torch.allclose(outs[0], outs[1])


def _listed(num: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """A BlockMask's ordered block lists -> dense [B, H, rows, cols] bool."""
    cols = idx.shape[-1]
    listed = torch.arange(cols) < num[..., None]
    dense = torch.zeros(*idx.shape[:-1], cols + 1, dtype=torch.bool)
    dense.scatter_(-1, torch.where(listed, idx, cols).long(), listed)
    return dense[..., :cols]


@pytest.mark.parametrize("lengths,T", [([7, 5, 9], 24), ([16], 16), ([11, 20, 6], 40), ([3, 4], 8)])
def test_cropped_block_mask_equals_a_fresh_one(lengths, T):
    """The flex mask of all K steps, cropped to the keys of the first n steps, has the same
    partial and full blocks (both ways: kv lists and q lists) as a mask made for n steps. Small
    blocks, so that rows span several blocks."""
    from torch.nn.attention.flex_attention import create_block_mask

    doc = torch.stack([doc_and_positions(lengths, T)[0], doc_and_positions([T], T)[0]])  # [2, T]
    steps = 4
    whole = create_block_mask(ttt_mask_mod(doc), 2, None, T, steps * T, device="cpu", BLOCK_SIZE=8)
    for n in range(1, steps + 1):
        fresh = create_block_mask(ttt_mask_mod(doc), 2, None, T, n * T, device="cpu", BLOCK_SIZE=8)
        cropped = crop_keys(whole, n * T)
        assert cropped.seq_lengths == fresh.seq_lengths == (T, n * T)
        assert cropped.kv_indices.shape == fresh.kv_indices.shape
        for num, idx in (
            ("kv_num_blocks", "kv_indices"),
            ("full_kv_num_blocks", "full_kv_indices"),
            ("q_num_blocks", "q_indices"),
            ("full_q_num_blocks", "full_q_indices"),
        ):
            assert torch.equal(getattr(cropped, num), getattr(fresh, num)), (n, num)
            dense = _listed(getattr(cropped, num), getattr(cropped, idx))
            assert torch.equal(dense, _listed(getattr(fresh, num), getattr(fresh, idx))), (n, idx)
        assert int(cropped.kv_indices.max()) < cropped.kv_indices.shape[-1]  # unlisted entries stay in range


@pytest.mark.slow
def test_flex_with_one_mask_for_all_steps_matches_eager():
    """A row of 128 tokens (one flex block) takes the cropped-mask path; eager is the reference."""
    model = tiny_drafter()
    T = 128
    torch.manual_seed(2)
    aux = torch.randn(1, T, 72, dtype=torch.float64)
    ids = torch.randint(0, 50, (1, T))
    doc, pos = doc_and_positions([40, 50, 30], T)
    with torch.no_grad():
        hidden0 = model.project(aux)
        eager = [out for _, out in unroll(model, hidden0, ids, pos[None], doc[None], K, "eager")]
        flex = [out for _, out in unroll(model, hidden0, ids, pos[None], doc[None], K, "flex-eager")]
    for a, b in zip(eager, flex):
        torch.testing.assert_close(b, a, rtol=1e-9, atol=1e-9)
