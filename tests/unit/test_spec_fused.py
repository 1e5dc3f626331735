"""The fused greedy chain cycle (staged observe + K-1 draft steps as one function, verification
on the device) against the step-by-step path and the generic tree verification it replaces."""

from __future__ import annotations

import pytest
import torch
from torch.overrides import TorchFunctionMode

from draftsmith.draft.model import DrafterConfig, Eagle3Drafter
from draftsmith.evaluate.decode import plain_generate, spec_generate
from draftsmith.evaluate.proposer import Draft, DrafterProposer
from draftsmith.runtime.engine import TargetEngine
from draftsmith.runtime.sampling import Sampling, verify, verify_chain_greedy
from tests.helpers import V, tiny_vocab_drafter, tiny_vocab_llama

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]  # on CUDA: the CUDA graphs of `draftsmith eval`


class AsTree:
    """A proposer's chain drafts, verified by the generic path (tree mask, `verify` on the host)."""

    mode = "tree"

    def __init__(self, proposer: DrafterProposer) -> None:
        self.proposer, self.size = proposer, proposer.size

    def reset(self) -> None:
        self.proposer.reset()

    def observe(self, aux: torch.Tensor, next_tokens: torch.Tensor) -> None:
        self.proposer.observe(aux, next_tokens)

    def propose(self) -> Draft:
        return self.proposer.propose()


class NoHostReads(TorchFunctionMode):
    """Fails on what a CUDA graph capture cannot hold: reading a tensor on the host (a sync), or
    a tensor made from host data (a host-to-device copy), indexing by a 0-dim tensor included."""

    HOST = {"item", "tolist", "__bool__", "__int__", "__float__", "__index__", "nonzero", "tensor", "cpu", "numpy"}

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        name = getattr(func, "__name__", "")
        assert name not in self.HOST, name
        if name == "__getitem__":
            index = args[1] if isinstance(args[1], tuple) else (args[1],)
            assert not any(isinstance(i, torch.Tensor) and (i.dim() == 0 or i.dtype == torch.bool) for i in index)
        return func(*args, **(kwargs or {}))


def test_fused_cycle_never_reads_the_host():
    """The staged observe and the fused cycle are capturable: no syncs, no host tensors (the
    CPU proxy of a CUDA graph capture; the capture itself is checked on GPU)."""
    model = tiny_vocab_llama()
    eng = TargetEngine(model, [0, 1, 2], max_len=64)
    prop = DrafterProposer(tiny_vocab_drafter(model), Sampling(), 64, mode="chain", depth=3)
    prompt = torch.tensor([1, 5, 7, 3, 9, 2, 4])
    _, aux = eng.prefill(prompt)
    prop.observe(aux, torch.cat([prompt[1:], torch.tensor([4])]))  # a prompt: its prefix runs eagerly
    with NoHostReads():
        prop.propose()
        prop.observe(aux[:2], prompt[:2])
        prop.propose()
    with NoHostReads(), pytest.raises(AssertionError):  # the guard works
        prop.vocab_map[torch.tensor(1)]


def test_verify_chain_greedy_equals_verify():
    g = torch.Generator().manual_seed(0)
    k = 4
    for _ in range(5):
        logits = torch.randn(k + 1, V, generator=g)
        top = logits.argmax(-1)  # [K+1]
        for j in range(k + 1):  # the first j drafts right, the next one wrong
            tokens = top[:-1].clone()
            if j < k:
                tokens[j] = (tokens[j] + 1) % V
            a, top_d, new = verify_chain_greedy(tokens, logits)
            path, bonus = verify(tokens.tolist(), list(range(k)), logits, Sampling())
            assert a == j and path == list(range(j + 1))
            assert new == tokens[:j].tolist() + [bonus] == top_d[: a + 1].tolist()


@pytest.mark.parametrize("device", DEVICES)
def test_fused_cycle_proposes_the_step_by_step_drafts(device):
    """Same drafter state, same observed rows (a prompt longer than K+1, then every m in
    1..K+1): the fused cycle and the step-by-step path draft the same tokens."""
    model = tiny_vocab_llama().to(device)
    eng = TargetEngine(model, [0, 1, 2], max_len=64)
    drafter = tiny_vocab_drafter(model).to(device)
    k = 4
    fused, steps = (DrafterProposer(drafter, Sampling(), 64, mode="chain", depth=k, fused=f) for f in (True, False))
    assert fused.fused and not steps.fused
    for p in (fused, steps):
        p.graph()
    prompt = torch.tensor([1, 5, 7, 3, 9, 2, 4, 6, 8, 10], device=device)
    _, aux = eng.prefill(prompt)
    rows = [(aux, torch.cat([prompt[1:], prompt[6:7]]))]
    g = torch.Generator().manual_seed(0)
    for m in [1, 2, 3, 4, 5, 1, 5]:
        noise, tokens = torch.randn(m, aux.shape[1], generator=g), torch.randint(0, V, (m,), generator=g)
        rows.append((aux[:m] + noise.to(device), tokens.to(device)))
    drafts = []
    for a, nxt in rows:
        for p in (fused, steps):
            p.observe(a, nxt)
        ours, ref = fused.propose(), steps.propose()
        assert torch.equal(ours.tokens, ref.tokens) and ours.parents == ref.parents == list(range(k))
        assert torch.equal(ours.depths, ref.depths) and ours.q is None
        drafts.append(ours.tokens.tolist())
    assert fused.n == steps.n == 10 + 21
    assert len({tuple(d) for d in drafts}) > 2  # the drafts vary, so that equality means something


def echo_drafter(model) -> Eagle3Drafter:
    """Drafts, over and over, the token before the root (the target's embedding, taken from aux
    layer 0 and read out by the embedding matrix; attention and MLP zeroed): right in the
    target's 1- and 2-cycles, so that the accepted counts vary from 0 to K."""
    emb = model.get_input_embeddings().weight  # [V, H]
    h = emb.shape[1]
    drafter = Eagle3Drafter(DrafterConfig.from_target(model.config, draft_vocab_size=V, aux_layer_ids=[0, 1, 2]))
    with torch.no_grad():
        drafter.load_target_embeddings(emb)
        drafter.t2d.fill_(True)
        drafter.fc.weight.zero_()
        drafter.fc.weight[:, :h] = torch.eye(h)  # hidden = the target's input embedding at t
        drafter.midlayer.self_attn.o_proj.weight.zero_()
        drafter.midlayer.mlp.down_proj.weight.zero_()
        drafter.lm_head.weight.copy_(emb)
    return drafter.eval()


@pytest.mark.parametrize("device", DEVICES)
def test_fused_spec_keeps_tokens_and_accepts(device):
    """Greedy chain decoding: the fused path gives the target's greedy output and the same
    accepted counts (so the same tau) as the step-by-step drafter with generic verification."""
    model = tiny_vocab_llama().to(device)
    eng = TargetEngine(model, [0, 1, 2], max_len=64)
    for t in (1, 4):  # plain decoding, verification of K=3
        eng.graph(t)
    drafter = echo_drafter(model).to(device)
    accepts = []
    for prompt in ([1, 5, 7, 3, 9], [2, 2, 8], [6, 10]):
        fused, steps = (DrafterProposer(drafter, Sampling(), 64, mode="chain", depth=3, fused=f) for f in (True, False))
        for p in (fused, steps):
            p.graph()
        plain = plain_generate(eng, prompt, 30, set(), Sampling())
        ours = spec_generate(eng, fused, prompt, 30, set(), Sampling())
        old = spec_generate(eng, AsTree(steps), prompt, 30, set(), Sampling())
        assert ours.tokens == old.tokens == plain.tokens
        assert ours.accepts == old.accepts
        accepts += ours.accepts
    assert set(accepts) == {0, 1, 3}  # none, some and all drafts accepted: 1, 2 and K+1 rows observed
