"""The drafting cycle (staged observe + the draft steps as one function of fixed-shape device
tensors, verification on the device): rows drafted in a batch as each alone, rows staged at
once as one by one; the greedy chain through chain and tree verification; the tree against
plain decoding; no host read inside a draft and one per cycle; the compiled drafter step."""

from __future__ import annotations

import shutil

import pytest
import torch
from torch.overrides import TorchFunctionMode

from draftsmith.draft.model import DrafterConfig, Eagle3Drafter
from draftsmith.evaluate.decode import plain_generate, spec_generate
from draftsmith.evaluate.proposer import Draft, DrafterProposer, chain_as_tree
from draftsmith.runtime.engine import TargetEngine
from draftsmith.runtime.sampling import Sampling, read_verified, tree_accept, verify_chain_greedy
from tests.helpers import V, tiny_vocab_drafter, tiny_vocab_llama

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]  # on CUDA: the CUDA graphs of `draftsmith eval`


class AsTree:
    """A proposer's chain drafts, verified as trees (tree mask, `tree_accept`, KV compaction)."""

    mode = "tree"

    def __init__(self, proposer: DrafterProposer) -> None:
        self.proposer, self.size, self.path_len = proposer, proposer.size, proposer.path_len

    def reset(self) -> None:
        self.proposer.reset()

    def observe_prompt(self, aux: torch.Tensor, next_tokens: torch.Tensor, pad: torch.Tensor) -> None:
        self.proposer.observe_prompt(aux, next_tokens, pad)

    def observe(self, aux: torch.Tensor, next_tokens: torch.Tensor, m: torch.Tensor) -> None:
        self.proposer.observe(aux, next_tokens, m)

    def propose(self) -> Draft:
        return chain_as_tree(self.proposer.propose())


class HostReads(TorchFunctionMode):
    """Records what a CUDA graph capture cannot hold: reading a tensor on the host (a sync), or
    a tensor made from host data (a host-to-device copy), indexing by a 0-dim or bool tensor
    and assigning a Python scalar through tensor indices included. `NoHostReads` fails on the
    first."""

    HOST = {"item", "tolist", "__bool__", "__int__", "__float__", "__index__", "nonzero", "tensor", "cpu", "numpy"}
    strict = False

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        read = name in self.HOST
        if name in ("__getitem__", "__setitem__"):
            index = args[1] if isinstance(args[1], tuple) else (args[1],)
            read = any(isinstance(i, torch.Tensor) and (i.dim() == 0 or i.dtype == torch.bool) for i in index)
            if name == "__setitem__" and not isinstance(
                args[2], torch.Tensor
            ):  # x[tensor index] = scalar: the scalar is
                read |= any(isinstance(i, torch.Tensor) for i in index)  # copied to the device (capture refuses it)
        assert not (read and self.strict), name
        if read:
            self.reads.append(name)
        return func(*args, **(kwargs or {}))


class NoHostReads(HostReads):
    strict = True


def prompt_state(eng: TargetEngine, prop, prompts: list[list[int]]) -> torch.Tensor:
    """Prefill `prompts` and let `prop` observe them (each followed by its own first token);
    returns the aux states [B, P, n_aux*H]."""
    _, aux, ids, pad = eng.prefill_rows(prompts)
    roots = torch.tensor([[p[0]] for p in prompts], device=ids.device)  # [B, 1]
    prop.observe_prompt(aux, torch.cat([ids[:, 1:], roots], dim=1), pad)
    return aux


def test_cycle_never_reads_the_host():
    """The staged observe and the drafting cycle are capturable: no syncs, no host tensors (the
    CPU proxy of a CUDA graph capture; the capture itself is checked on GPU)."""
    model = tiny_vocab_llama()
    eng = TargetEngine(model, [0, 1, 2], max_len=64, batch=2)
    prop = DrafterProposer(tiny_vocab_drafter(model), Sampling(), 64, mode="chain", depth=3, batch=2)
    aux = prompt_state(eng, prop, [[1, 5, 7, 3, 9, 2, 4], [3, 3]])  # a prompt's prefix runs eagerly
    with NoHostReads():
        prop.propose()
        m = torch.ones(2, dtype=torch.long) * 2
        prop.observe(aux[:, :2], aux[:, :2, 0].long(), m)
        prop.propose()
    with NoHostReads(), pytest.raises(AssertionError):  # the guard works
        prop.vocab_map[torch.tensor(1)]
    with (
        NoHostReads(),
        pytest.raises(AssertionError),
    ):  # an index_put of a host scalar (what capture refused on the H200)
        prop.k_cache[:, torch.arange(1)] = 0


def test_verify_chain_greedy_equals_tree_accept():
    """A batch of chains, the first j drafts of row j right: both verifications agree."""
    k = 4
    logits = torch.randn(k + 1, k + 1, V, generator=torch.Generator().manual_seed(0))  # [B = K+1, K+1, V]
    top = logits.argmax(-1)  # [B, K+1]
    tokens = top[:, :-1].clone()
    for j in range(k):
        tokens[j, j] = (tokens[j, j] + 1) % V
    a, top_d, new = verify_chain_greedy(tokens, logits)
    tree = chain_as_tree(Draft(tokens, torch.arange(1, k + 1).expand(k + 1, k)))
    a_t, path, new_t = tree_accept(tree.tokens, tree.parents, tree.depths, tree.anc, logits, Sampling(), k + 1)
    a_t, new_t, host = read_verified(a_t, new_t)
    assert a.tolist() == a_t.tolist() == list(range(k + 1)) and path.tolist() == [list(range(k + 1))] * (k + 1)
    for j in range(k + 1):
        assert (
            new[j]
            == host[j]
            == tokens[j, :j].tolist() + [int(top[j, j])]
            == top_d[j, : j + 1].tolist()
            == new_t[j, : j + 1].tolist()
        )


@pytest.mark.parametrize("mode", ["chain", "tree"])
@pytest.mark.parametrize("device", DEVICES)
def test_rows_draft_as_each_alone(device, mode):
    """Two rows of other prompt lengths drafted in one batch (each accepting its own count,
    one parked, then restarted) draft what each drafts alone; staging m rows at once drafts
    what staging them one by one does."""
    model = tiny_vocab_llama().to(device)
    drafter = tiny_vocab_drafter(model).to(device)
    shape = dict(mode=mode, depth=4, top_k=2, total_tokens=6)
    prompts = [[1, 5, 7, 3, 9, 2, 4, 6, 8, 10], [2, 8, 6, 4]]
    both = DrafterProposer(drafter, Sampling(), 64, batch=2, **shape)
    alone = [DrafterProposer(drafter, Sampling(), 64, **shape) for _ in prompts]
    for p in (both, *alone):
        p.graph()
    aux = prompt_state(TargetEngine(model, [0, 1, 2], max_len=64, batch=2), both, prompts)
    for p, prompt in zip(alone, prompts, strict=True):
        prompt_state(TargetEngine(model, [0, 1, 2], max_len=64), p, [prompt])
    g = torch.Generator().manual_seed(0)
    drafts = []
    for ms in [(1, 2), (3, 1), (5, 5), (2, 0), (1, 4)]:  # m = 0: row 1 parked at position 0
        length = both.path_len
        rows = (
            aux[:, :length] + torch.randn(2, length, aux.shape[-1], generator=g).to(device),
            torch.randint(0, V, (2, length), generator=g).to(device),
        )
        ours = both.propose()
        for b, p in enumerate(alone):
            ref = p.propose()
            assert torch.equal(ours.tokens[b], ref.tokens[0]) and torch.equal(ours.depths[b], ref.depths[0])
            if mode == "tree":
                assert torch.equal(ours.parents[b], ref.parents[0]) and torch.equal(ours.anc[b], ref.anc[0])
            drafts.append(tuple(ref.tokens[0].tolist()))
        m = torch.tensor(ms, device=device).clamp(max=length)
        both.observe(*rows, m)
        for b, p in enumerate(alone):
            if b == 0 and ms[0] > 1:  # row 0 staged one row at a time instead
                for j in range(int(m[0])):
                    p.observe(
                        rows[0][:1, j : j + 1], rows[1][:1, j : j + 1], torch.ones(1, dtype=torch.long, device=device)
                    )
                    if j < int(m[0]) - 1:
                        p.propose()
            else:
                p.observe(rows[0][b : b + 1], rows[1][b : b + 1], m[b : b + 1])
    assert both.n.tolist() == [p.n.item() for p in alone] and len(set(drafts)) > 3  # the drafts vary


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


@pytest.mark.slow
@pytest.mark.parametrize("device", DEVICES)
def test_fused_spec_keeps_tokens_and_accepts(device):
    """Greedy chain decoding (on CUDA compiled and graphed) gives the target's greedy output,
    and the same accepted counts (so the same tau) as its drafts verified as trees."""
    model = tiny_vocab_llama().to(device)
    eng = TargetEngine(model, [0, 1, 2], max_len=64)
    for t in (1, 4):  # plain decoding, verification of K=3
        eng.graph_rows(t)
    drafter = echo_drafter(model).to(device)
    accepts = []
    for prompt in ([1, 5, 7, 3, 9], [2, 2, 8], [6, 10]):
        fused, steps = (
            DrafterProposer(drafter, Sampling(), 64, mode="chain", depth=3, compile=c)
            for c in (device == "cuda", False)
        )
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
    eng._forward_eager = lambda ids, pos, slots, mask, last_only=False: TargetEngine._forward(
        eng, ids, pos, slots, mask[:, None], last_only
    )
    return eng


@pytest.mark.parametrize(
    "sampling", [Sampling(), Sampling(temperature=1.0, top_p=0.9, seed=0)], ids=["greedy", "sampled"]
)
def test_tree_cycle_reads_the_host_once(sampling):
    """A tree cycle of two rows: the draft (top-k, selection, parent rows, ancestor mask) reads
    nothing on the host; the cycle (draft, tree-mask forward, `tree_accept`, compaction, staged
    observe) reads once."""
    from draftsmith.evaluate.decode import _verify, tree_acceptance

    model = tiny_vocab_llama()
    with torch.no_grad():
        eng = graphless(TargetEngine(model, [0, 1, 2], max_len=64, batch=2))
        prop = DrafterProposer(
            echo_drafter(model), sampling, 64, mode="tree", depth=3, top_k=2, total_tokens=5, batch=2
        )
        prompts = [[1, 5, 7, 3, 9, 2, 4], [8, 2]]
        _, aux, ids, pad = eng.prefill_rows(prompts)
        root = torch.tensor([[4], [6]])  # [B, 1]
        prop.observe_prompt(aux, torch.cat([ids[:, 1:], root], dim=1), pad)
        with NoHostReads():
            draft = prop.propose()
        assert draft.tokens.shape == (2, 5) and draft.anc.shape == (2, 6, 6)
        n = torch.tensor([7, 2])
        accept = tree_acceptance(eng, prop.size, prop.path_len, sampling)
        for _ in range(4):
            with HostReads() as reads:
                accepted, new, _, acc_aux = _verify(eng, prop, prop.propose(), root, pad, n, [], sampling, accept)
                prop.observe(acc_aux, new, accepted + 1)
            assert reads.reads == ["tolist"]
            root, n = new.gather(1, accepted[:, None]), n + accepted + 1


@pytest.mark.slow
@pytest.mark.parametrize("device", DEVICES)
def test_fused_tree_equals_plain(device):
    """Greedy tree decoding (fused draft; on CUDA compiled and graphed; device verification and
    compaction) gives the target's greedy output, with none, one and two of the drafted levels accepted."""
    model = tiny_vocab_llama().to(device)
    eng = TargetEngine(model, [0, 1, 2], max_len=64)
    drafter = echo_drafter(model).to(device)
    accepts = []
    for prompt in ([1, 5, 7, 3, 9], [2, 2, 8], [6, 10]):
        prop = DrafterProposer(
            drafter, Sampling(), 64, mode="tree", depth=3, top_k=2, total_tokens=5, compile=device == "cuda"
        )
        for t in (1, prop.size + 1):
            eng.graph_rows(t)
        eng.graph_compact(prop.path_len)
        prop.graph()
        plain = plain_generate(eng, prompt, 30, set(), Sampling())
        ours = spec_generate(eng, prop, prompt, 30, set(), Sampling())
        assert ours.tokens == plain.tokens
        accepts += ours.accepts
    assert {0, 1, 2} <= set(accepts)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("g++") is None, reason="inductor's CPU backend needs a C++ compiler")
@pytest.mark.parametrize("mode", ["tree", "chain"])
def test_compiled_drafter_step_drafts_the_same(mode):
    """`torch.compile` (inductor; on CPU its C++ backend) of the draft inside the fused cycle,
    as one region with the glue between its steps (a chain's argmax and id lookups; a tree's
    top-k expansion, selection and ancestor mask): the same drafts as the eager step, and greedy
    decoding still equals plain decoding. A prompt's prefix of any length runs through the eager
    step, so nothing recompiles."""
    model = tiny_vocab_llama()
    eng = TargetEngine(model, [0, 1, 2], max_len=64)
    drafter = echo_drafter(model)
    eager, compiled = (
        DrafterProposer(drafter, Sampling(), 64, mode=mode, depth=3, top_k=2, total_tokens=4, compile=c)
        for c in (False, True)
    )
    assert compiled.draft_region is not None  # the draft's steps compiled as one region
    prompt = [1, 5, 7, 3, 9, 2, 4]
    for p in (eager, compiled):
        aux = prompt_state(eng, p, [prompt])
    for m in (3, 1, 2):
        ours, ref = compiled.propose(), eager.propose()
        assert torch.equal(ours.tokens, ref.tokens) and (mode == "chain" or torch.equal(ours.parents, ref.parents))
        for p in (eager, compiled):
            p.observe(aux[:, -3:], aux[:, -3:, 0].long().abs() % V, torch.tensor([m]))
    for prompt in ([1, 5, 7, 3, 9], [2, 2, 8, 6]):
        plain = plain_generate(eng, prompt, 20, set(), Sampling())
        assert spec_generate(eng, compiled, prompt, 20, set(), Sampling()).tokens == plain.tokens
    assert compiled.compiled and compiled.draft_region is not None


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("g++") is None, reason="inductor's CPU backend needs a C++ compiler")
def test_compiled_draft_of_a_deeper_drafter_drafts_the_same():
    """--num-layers 2 through the compiled draft region: each layer's attention writes and reads
    its own slice of the KV cache inside the region, and the drafts equal the eager step's."""
    model = tiny_vocab_llama()
    eng = TargetEngine(model, [0, 1, 2], max_len=64)
    drafter = tiny_vocab_drafter(model, num_layers=2)
    eager, compiled = (
        DrafterProposer(drafter, Sampling(), 64, mode="chain", depth=3, compile=c) for c in (False, True)
    )
    aux = [prompt_state(eng, p, [[1, 5, 7, 3, 9, 2, 4]]) for p in (eager, compiled)][0]
    drafts = []
    for m in (3, 1, 2):
        ours, ref = compiled.propose(), eager.propose()
        assert torch.equal(ours.tokens, ref.tokens)
        drafts.append(ref.tokens)
        for p in (eager, compiled):
            p.observe(aux[:, -3:], aux[:, -3:, 0].long().abs() % V, torch.tensor([m]))
    assert (
        compiled.compiled
        and compiled.draft_region is not None
        and len({tuple(t.flatten().tolist()) for t in drafts}) > 1
    )


def test_the_acceptance_graphs_warm_up_leaves_the_cache_as_it_was():
    """`no_draft`, the tree acceptance graph's warm-up input (its logits are whatever the last
    verification left): whatever the logits, nothing is accepted and the compaction moves every
    slot onto itself, so the keys and values in the cache are unchanged."""
    from draftsmith.evaluate.decode import _accept_tree, no_draft

    eng = TargetEngine(tiny_vocab_llama(), [0, 1, 2], max_len=64, batch=2)
    torch.manual_seed(0)
    eng.kv.copy_(torch.randn_like(eng.kv))
    before = eng.kv.clone()
    tokens, parents, depths, anc, pad, n = no_draft(2, 5, eng.kv.device)
    for logits in (torch.zeros(2, 6, V), torch.randn(2, 6, V), -torch.randn(2, 6, V)):
        aux = torch.randn(2, 6, 3)
        accepted, new, path_aux = _accept_tree(
            eng.compact_eager, Sampling(), 4, tokens, parents, depths, anc, logits, aux, pad, n
        )
        assert accepted.tolist() == [0, 0] and new[:, 0].tolist() == logits[:, 0].argmax(-1).tolist()
        torch.testing.assert_close(path_aux, aux[:, :4])  # the root, then rows 1.. in order
    assert torch.equal(eng.kv, before)
