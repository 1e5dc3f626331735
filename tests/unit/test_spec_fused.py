"""The fused cycles (staged observe + the draft steps as one function of fixed-shape device
tensors, verification on the device): the greedy chain against the step-by-step path and the
tree verification; the tree against plain decoding; no host read inside a draft and one per
cycle."""

from __future__ import annotations

import shutil

import pytest
import torch
from torch.overrides import TorchFunctionMode

from draftsmith.draft.model import DrafterConfig, Eagle3Drafter
from draftsmith.evaluate.decode import plain_generate, spec_generate
from draftsmith.evaluate.proposer import Draft, DrafterProposer, chain_as_tree
from draftsmith.runtime.engine import TargetEngine
from draftsmith.runtime.sampling import Sampling, verify_chain_greedy, verify_tree
from tests.helpers import V, tiny_vocab_drafter, tiny_vocab_llama

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]  # on CUDA: the CUDA graphs of `draftsmith eval`


class AsTree:
    """A proposer's chain drafts, verified as trees (tree mask, `verify_tree`, KV compaction)."""

    mode = "tree"

    def __init__(self, proposer: DrafterProposer) -> None:
        self.proposer, self.size, self.path_len = proposer, proposer.size, proposer.path_len

    def reset(self) -> None:
        self.proposer.reset()

    def observe(self, aux: torch.Tensor, next_tokens: torch.Tensor) -> None:
        self.proposer.observe(aux, next_tokens)

    def propose(self) -> Draft:
        return chain_as_tree(self.proposer.propose())


class HostReads(TorchFunctionMode):
    """Records what a CUDA graph capture cannot hold: reading a tensor on the host (a sync), or
    a tensor made from host data (a host-to-device copy), indexing by a 0-dim or bool tensor
    included. `NoHostReads` fails on the first."""

    HOST = {"item", "tolist", "__bool__", "__int__", "__float__", "__index__", "nonzero", "tensor", "cpu", "numpy"}
    strict = False

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        name = getattr(func, "__name__", "")
        read = name in self.HOST
        if name == "__getitem__":
            index = args[1] if isinstance(args[1], tuple) else (args[1],)
            read = any(isinstance(i, torch.Tensor) and (i.dim() == 0 or i.dtype == torch.bool) for i in index)
        assert not (read and self.strict), name
        if read:
            self.reads.append(name)
        return func(*args, **(kwargs or {}))


class NoHostReads(HostReads):
    strict = True


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


def test_verify_chain_greedy_equals_verify_tree():
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
            tree = chain_as_tree(Draft(tokens, torch.arange(1, k + 1)))
            a_t, path, new_t, host = verify_tree(tree.tokens, tree.parents, tree.depths, tree.anc, logits, Sampling(), k + 1)
            assert a == a_t == j and path[: j + 1].tolist() == list(range(j + 1))
            assert new == host == tokens[:j].tolist() + [int(top[j])] == top_d[: a + 1].tolist() == new_t.tolist()


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
        assert torch.equal(ours.tokens, ref.tokens) and ours.parents is ref.parents is None
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
    """Greedy chain decoding: the fused path (on CUDA compiled and graphed) gives the target's
    greedy output and the same accepted counts (so the same tau) as the step-by-step drafter with generic verification."""
    model = tiny_vocab_llama().to(device)
    eng = TargetEngine(model, [0, 1, 2], max_len=64)
    for t in (1, 4):  # plain decoding, verification of K=3
        eng.graph(t)
    drafter = echo_drafter(model).to(device)
    accepts = []
    for prompt in ([1, 5, 7, 3, 9], [2, 2, 8], [6, 10]):
        fused, steps = (DrafterProposer(drafter, Sampling(), 64, mode="chain", depth=3, fused=f, compile=f and device == "cuda")
                        for f in (True, False))
        for p in (fused, steps):
            p.graph()
        assert fused.compiled == (device == "cuda")  # on CUDA: the compiled step inside the captured cycle
        plain = plain_generate(eng, prompt, 30, set(), Sampling())
        ours = spec_generate(eng, fused, prompt, 30, set(), Sampling())
        old = spec_generate(eng, AsTree(steps), prompt, 30, set(), Sampling())
        assert ours.tokens == old.tokens == plain.tokens
        assert ours.accepts == old.accepts
        accepts += ours.accepts
    assert set(accepts) == {0, 1, 3}  # none, some and all drafts accepted: 1, 2 and K+1 rows observed


def graphless(eng: TargetEngine) -> TargetEngine:
    """The engine's forward over the whole cache width, as its CUDA graphs run it (the eager
    CPU path reads the mask on the host to attend over only the slots in use)."""
    eng._forward_eager = lambda ids, pos, slots, mask, last_only=False: TargetEngine._forward(  # noqa: E731
        eng, ids, pos, slots, mask[:, None], last_only)
    return eng


@pytest.mark.parametrize("sampling", [Sampling(), Sampling(temperature=1.0, top_p=0.9, seed=0)], ids=["greedy", "sampled"])
def test_tree_cycle_reads_the_host_once(sampling):
    """A tree cycle: the fused draft (top-k, selection, parent rows, ancestor mask) reads nothing
    on the host; the cycle (draft, tree-mask forward, `verify_tree`, compaction, staged observe)
    reads once."""
    from draftsmith.evaluate.decode import _verify_tree

    model = tiny_vocab_llama()
    with torch.no_grad():
        eng = graphless(TargetEngine(model, [0, 1, 2], max_len=64))
        prop = DrafterProposer(echo_drafter(model), sampling, 64, mode="tree", depth=3, top_k=2, total_tokens=5)
        prompt = torch.tensor([1, 5, 7, 3, 9, 2, 4])
        _, aux = eng.prefill(prompt)
        root, n = torch.tensor([4]), 7
        prop.observe(aux, torch.cat([prompt[1:], root]))
        with NoHostReads():
            draft = prop.propose()
        assert draft.tokens.shape == (5,) and draft.anc.shape == (6, 6)
        for _ in range(4):
            with HostReads() as reads:
                draft = prop.propose()
                new, aux, nxt = _verify_tree(eng, draft, root, n, sampling, prop.path_len)
                prop.observe(aux, nxt)
            assert reads.reads == ["tolist"]
            root, n = nxt[-1:], n + len(new)


@pytest.mark.parametrize("device", DEVICES)
def test_fused_tree_equals_plain(device):
    """Greedy tree decoding (fused draft; on CUDA compiled and graphed; device verification and
    compaction) gives the target's greedy output, with none, one and two of the drafted levels accepted."""
    model = tiny_vocab_llama().to(device)
    eng = TargetEngine(model, [0, 1, 2], max_len=64)
    drafter = echo_drafter(model).to(device)
    accepts = []
    for prompt in ([1, 5, 7, 3, 9], [2, 2, 8], [6, 10]):
        prop = DrafterProposer(drafter, Sampling(), 64, mode="tree", depth=3, top_k=2, total_tokens=5, compile=device == "cuda")
        for t in (1, prop.size + 1):
            eng.graph(t)
        eng.graph_compact(prop.path_len)
        prop.graph()
        plain = plain_generate(eng, prompt, 30, set(), Sampling())
        ours = spec_generate(eng, prop, prompt, 30, set(), Sampling())
        assert ours.tokens == plain.tokens
        accepts += ours.accepts
    assert {0, 1, 2} <= set(accepts)


@pytest.mark.skipif(shutil.which("g++") is None, reason="inductor's CPU backend needs a C++ compiler")
def test_compiled_drafter_step_drafts_the_same():
    """`torch.compile` (inductor; on CPU its C++ backend) of the drafter step inside the fused tree
    cycle: the same drafts as the eager step, and greedy decoding still equals plain decoding.
    A prompt's prefix of any length runs through the eager step, so nothing recompiles."""
    model = tiny_vocab_llama()
    eng = TargetEngine(model, [0, 1, 2], max_len=64)
    drafter = echo_drafter(model)
    eager, compiled = (DrafterProposer(drafter, Sampling(), 64, mode="tree", depth=2, top_k=2, total_tokens=4, compile=c)
                       for c in (False, True))
    prompt = torch.tensor([1, 5, 7, 3, 9, 2, 4])
    _, aux = eng.prefill(prompt)
    for m in (7, 1, 3, 2):
        for p in (eager, compiled):
            p.observe(aux[-m:], prompt[-m:])
        ours, ref = compiled.propose(), eager.propose()
        assert torch.equal(ours.tokens, ref.tokens) and torch.equal(ours.parents, ref.parents)
    for prompt in ([1, 5, 7, 3, 9], [2, 2, 8, 6]):
        plain = plain_generate(eng, prompt, 20, set(), Sampling())
        assert spec_generate(eng, compiled, prompt, 20, set(), Sampling()).tokens == plain.tokens
    assert compiled.compiled
