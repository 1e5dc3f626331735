"""The static-KV-cache engine against HF, and greedy speculative decoding against plain decoding."""

from __future__ import annotations

import pytest
import torch

from draftsmith.evaluate.decode import plain_generate, spec_generate
from draftsmith.evaluate.proposer import DrafterProposer, OracleProposer, tree_ancestors
from draftsmith.layers import default_aux_layers
from draftsmith.runtime.engine import TargetEngine
from draftsmith.runtime.sampling import Sampling
from draftsmith.target import decoder_layers
from tests.helpers import random_drafter


def engine_for(model, max_len: int = 256) -> TargetEngine:
    return TargetEngine(model, default_aux_layers(len(decoder_layers(model))), max_len)


def test_prefill_and_decode_logits_equal_hf(tiny_model):
    ids = torch.randint(0, 1000, (20,))
    ref = tiny_model(ids[None]).logits[0]
    eng = engine_for(tiny_model)
    logits, aux = eng.prefill(ids[:12])
    assert torch.allclose(logits, ref[:12], atol=1e-4)
    assert aux.shape == (12, 3 * 64)
    for i in range(12, 20):  # one token at a time from the cache
        pos = torch.tensor([i])
        step, _ = eng.forward(ids[i : i + 1], pos, pos, eng.causal_mask(i, 1))
        assert torch.allclose(step[0], ref[i], atol=1e-4)


def test_tree_mask_forward_equals_each_path(tiny_model):
    """Two branches verified in one forward give each branch's own causal logits."""
    prefix = torch.randint(0, 1000, (10,))
    a, b = torch.tensor([5, 6, 7]), torch.tensor([8, 9])
    eng = engine_for(tiny_model)
    eng.prefill(prefix)
    parents = [0, 1, 2, 0, 4]  # rows 1-3: branch a; rows 4-5: branch b
    rows = torch.cat([a, b])
    depths = torch.tensor([1, 2, 3, 1, 2])
    root = torch.tensor([3])
    ids = torch.cat([root, rows])
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), depths])[
        None
    ]  # [1, 6]: positions after the 10 cached tokens
    anc = tree_ancestors(torch.tensor([parents]), 3)  # [1, 6, 6]
    logits, _ = eng.rows_forward(ids[None], torch.tensor([0]), torch.tensor([10]), anc, offsets)
    logits = logits[0]
    ref_a = tiny_model(torch.cat([prefix, root, a])[None]).logits[0, 10:]
    ref_b = tiny_model(torch.cat([prefix, root, b])[None]).logits[0, 11:]
    assert torch.allclose(logits[:4], ref_a, atol=1e-4)
    assert torch.allclose(logits[4:], ref_b, atol=1e-4)
    # compaction of branch b, then one more token continues it exactly
    eng.compact(torch.tensor([[10, 14, 15]]), torch.tensor([[10, 11, 12]]))
    pos = torch.tensor([13])
    nxt, _ = eng.forward(torch.tensor([11]), pos, pos, eng.causal_mask(13, 1))
    ref = tiny_model(torch.cat([prefix, root, b, torch.tensor([11])])[None]).logits[0, -1]
    assert torch.allclose(nxt[0], ref, atol=1e-4)


def test_plain_greedy_equals_hf_generate(tiny_model):
    prompt = [1, 50, 60, 70, 80]
    ref = tiny_model.generate(
        torch.tensor([prompt]), do_sample=False, max_new_tokens=16, eos_token_id=None, pad_token_id=0, min_new_tokens=16
    )[0, len(prompt) :].tolist()
    out = plain_generate(engine_for(tiny_model), prompt, 16, set(), Sampling())
    assert out.tokens == ref


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["chain", "tree"])
def test_greedy_spec_equals_plain_random_drafter(tiny_model, mode):
    eng = engine_for(tiny_model)
    prop = DrafterProposer(
        random_drafter(tiny_model, draft_vocab_size=4000, stride=2),
        Sampling(),
        eng.max_len,
        mode=mode,
        depth=3,
        top_k=3,
        total_tokens=8,
    )
    for seed in range(3):
        prompt = torch.randint(0, 1000, (8,), generator=torch.Generator().manual_seed(seed)).tolist()
        plain = plain_generate(eng, prompt, 20, set(), Sampling())
        spec = spec_generate(eng, prop, prompt, 20, set(), Sampling())
        assert spec.tokens == plain.tokens
        assert 1 <= len(spec.accepts) <= len(spec.tokens)  # every target call yields at least one token


@pytest.mark.parametrize("mode", ["chain", "tree"])
def test_oracle_gives_tau_k_plus_1(tiny_model, mode):
    eng = engine_for(tiny_model)
    prompt = [1, 50, 60, 70, 80]
    plain = plain_generate(eng, prompt, 40, set(), Sampling())
    oracle = OracleProposer(prompt + plain.tokens, mode=mode, depth=4, vocab_size=eng.vocab_size)
    spec = spec_generate(eng, oracle, prompt, 40, set(), Sampling())
    assert spec.tokens == plain.tokens
    tau = sum(a + 1 for a in spec.accepts) / len(spec.accepts)
    assert tau >= 4.5, spec.accepts  # K+1 = 5, less only at the end


def test_stop_token_cuts_both_the_same(tiny_model):
    eng = engine_for(tiny_model)
    prompt = [1, 50, 60, 70, 80]
    free = plain_generate(eng, prompt, 20, set(), Sampling()).tokens
    stop = {free[6]}
    plain = plain_generate(eng, prompt, 20, stop, Sampling())
    prop = DrafterProposer(random_drafter(tiny_model), Sampling(), eng.max_len, mode="chain", depth=3)
    spec = spec_generate(eng, prop, prompt, 20, stop, Sampling())
    assert plain.tokens == spec.tokens == free[: free.index(free[6]) + 1]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["chain", "tree"])
def test_batch_rows_decode_as_each_alone(tiny_model, mode):
    """Three prompts of other lengths in one batch, each row on its own (its own accepted
    counts; one stops early at a stop token, the others run to the token limit): greedy plain and
    speculative decoding give every row what plain decoding gives it alone (fp32)."""
    from draftsmith.evaluate.decode import decode

    drafter = random_drafter(tiny_model, draft_vocab_size=4000, stride=2)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 1000, (n,), generator=gen).tolist() for n in (8, 3, 12)]
    alone = [plain_generate(engine_for(tiny_model), p, 20, set(), Sampling()).tokens for p in prompts]
    stop = {
        next(t for i, t in enumerate(alone[1]) if i >= 3 and t not in alone[1][:i])
    }  # row 1 stops after a few tokens
    alone = [plain_generate(engine_for(tiny_model), p, 20, stop, Sampling()).tokens for p in prompts]
    eng = TargetEngine(tiny_model, default_aux_layers(2), 256, batch=3)
    prop = DrafterProposer(drafter, Sampling(), 256, mode=mode, depth=3, top_k=3, total_tokens=8, batch=3)
    plain = decode(eng, prompts, 20, stop, Sampling())
    spec = decode(eng, prompts, 20, stop, Sampling(), prop)
    assert [t.tokens for t in plain] == [t.tokens for t in spec] == alone
    assert 3 < len(alone[1]) < 20 and len(alone[0]) == 20  # the rows finished at other times
    assert all(1 <= len(t.accepts) <= len(t.tokens) for t in spec) and spec[0].seconds == spec[2].seconds


@pytest.mark.parametrize("mode", ["chain", "tree"])
def test_a_failed_graph_capture_drafts_without_graphs(tiny_model, mode, monkeypatch, capsys):
    """On a GPU a capture that fails (a capture hazard in the draft code) must not end the
    eval: the proposer says so, drafts without graphs and the report can tell (`graphed`).
    Emulated on CPU: every capture raises, as CUDA's does for a host copy."""
    import draftsmith.evaluate.proposer as proposer_mod

    def refuse(*_args, **_kwargs):
        raise RuntimeError("Cannot copy between CPU and CUDA tensors during CUDA graph capture")

    monkeypatch.setattr(proposer_mod, "Graphed", refuse)
    prop = DrafterProposer(
        random_drafter(tiny_model, draft_vocab_size=4000, stride=2),
        Sampling(),
        64,
        mode=mode,
        depth=3,
        top_k=3,
        total_tokens=8,
    )
    prop.device = torch.device("cuda")  # graph() captures on CUDA only
    prop.graph()
    prop.device = torch.device("cpu")
    assert not prop.graphed and prop.cycle is None
    assert "drafting without graphs" in capsys.readouterr().err
    eng = TargetEngine(tiny_model, prop.drafter.config.aux_layer_ids, 64)
    prompt = [1, 5, 7, 3, 9]
    plain = plain_generate(eng, prompt, 12, set(), Sampling())
    assert spec_generate(eng, prop, prompt, 12, set(), Sampling()).tokens == plain.tokens


@pytest.mark.parametrize("max_len", [128, 130])
def test_chain_draft_step_inputs_start_on_16_bytes(tiny_model, max_len):
    """A chain cycle's per-step masks, positions and slots are slices of tensors made once per
    cycle; each slice starts on a 16-byte boundary, since inductor clones (one more kernel in the
    graph) a compiled step's input that does not. The steps see what the unsliced rule gives."""
    prop = DrafterProposer(random_drafter(tiny_model), Sampling(), max_len, mode="chain", depth=4)
    seen = []
    prop._step = lambda hidden, ids, pos, slots, mask: (
        seen.append((pos, slots, mask)) or (torch.zeros(hidden.shape[0], 1, prop.chain_masks.shape[0] + 1000), hidden)
    )
    n, base = torch.tensor([5, 9]), torch.tensor([0, 2])
    prop._chain_from(torch.zeros(2, 1000), torch.zeros(2, tiny_model.config.hidden_size), base, n)
    assert len(seen) == 3
    cols = prop.cols
    for i, (pos, slots, mask) in enumerate(seen):
        assert all(t.data_ptr() % 16 == 0 for t in (pos, slots, mask))
        assert pos.tolist() == [[5 + i], [9 + i]] and slots.tolist() == [[max_len + i]] * 2
        want = ((cols >= base[:, None]) & (cols < (base + n)[:, None])) | ((cols >= max_len) & (cols <= max_len + i))
        assert torch.equal(mask[:, 0], want)


def test_compaction_moves_every_layers_keys_and_values_of_each_row(tiny_model):
    """One gather and one scatter over [2, L, B, nkv, S, hd] move what a loop over the layers
    would, row by row, and the layers' caches stay views of that one tensor."""
    eng = TargetEngine(tiny_model, [], 32, batch=2)
    eng.kv.copy_(torch.randn_like(eng.kv))
    ref = eng.kv.clone()
    src, dst = torch.tensor([[10, 14, 15], [20, 21, 25]]), torch.tensor([[10, 11, 12], [20, 21, 22]])
    for b in range(2):
        ref[:, :, b, :, dst[b]] = ref[:, :, b, :, src[b]]
    eng.compact(src, dst)
    assert torch.equal(eng.kv, ref)
    assert all(k.data_ptr() == eng.kv[0, i].data_ptr() for i, k in enumerate(eng.k_cache))
    assert all(v.data_ptr() == eng.kv[1, i].data_ptr() for i, v in enumerate(eng.v_cache))


def test_top_log_probs_are_the_top_k_of_the_log_softmax():
    from draftsmith.evaluate.proposer import top_log_probs

    logits = torch.randn(3, 4, 500) * 5
    ref_scores, ref_ids = torch.log_softmax(logits, -1).topk(6, dim=-1)
    scores, ids = top_log_probs(logits, 6)
    assert torch.equal(ids, ref_ids)
    assert torch.allclose(scores, ref_scores, atol=1e-5)
