"""The batched static-KV generator of `synth` (synth/generate.py) on the tiny Llama in fp32:
greedy tokens equal HF `generate` on each prompt alone, seeded sampling, stop ids, dummy rows,
and the backend's choice and reuse of the engine."""

from __future__ import annotations

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from draftsmith.errors import UserError
from draftsmith.runtime.engine import TargetEngine
from draftsmith.runtime.sampling import Sampling
from draftsmith.synth.config import SynthConfig
from draftsmith.synth.generate import CHECK_EVERY, generate, generate_refilling, refill_width
from draftsmith.synth.local import LocalBackend, uses_engine
from draftsmith.synth.turns import Request
from draftsmith.target import target_from_model
from tests.helpers import tiny_causal_lm

LENGTHS = [3, 11, 1, 6]  # one batch, left-padded to 11


def _prompts(n: int = 4) -> list[list[int]]:
    gen = torch.Generator().manual_seed(0)
    return [torch.randint(3, 1000, (k,), generator=gen).tolist() for k in LENGTHS[:n]]


def _greedy(n: int) -> Sampling:
    return Sampling(0.0, 1.0, 0, n, 0)


def _hf_greedy(model, prompt: list[int], n: int) -> list[int]:
    ids = torch.tensor([prompt])
    with torch.inference_mode():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=n,
            min_new_tokens=n,
            eos_token_id=None,
            pad_token_id=0,
        )
    return out[0, len(prompt) :].tolist()


@pytest.fixture(scope="module")
def engine(tiny_model):
    return TargetEngine(tiny_model, [], max_len=64, batch=4)


@pytest.fixture(scope="module")
def refs(tiny_model):
    return [_hf_greedy(tiny_model, p, 20) for p in _prompts()]


@pytest.mark.slow
def test_greedy_equals_hf_generate_per_prompt(engine, refs):
    prompts = _prompts()
    assert generate(engine, prompts, _greedy(20), set(), pad_id=0, seed=0) == refs
    # a short batch (one dummy row) of another width, on the same engine
    assert generate(engine, prompts[:3], _greedy(20), set(), pad_id=0, seed=0) == refs[:3]


@pytest.mark.slow
def test_graph_shaped_decode_equals_hf_generate(tiny_model, refs, monkeypatch):
    """What a CUDA graph runs on GPU: each decode step attends over every slot of the width
    bucket (no trimming to the slots in use), through the graph's calling convention."""
    engine = TargetEngine(tiny_model, [], max_len=64, batch=4)
    monkeypatch.setattr(
        engine, "graph", lambda t, width, rows=None: engine.graphs.setdefault((rows or 4, t, width), engine._forward)
    )
    assert generate(engine, _prompts(), _greedy(20), set(), pad_id=0, seed=0) == refs
    assert list(engine.graphs) == [(4, 1, 64)]  # 4 rows: fewer than MIN_ROWS, no smaller graphs


@pytest.mark.parametrize("arch", ["llama", "mistral"])  # mistral: a sliding window, the slots' positions move too
def test_kept_rows_forward_as_they_did_in_the_full_batch(arch):
    """`keep_rows` moves rows of the cache to the front, and a forward of fewer rows reads the
    cache's first rows: rows 2 and 0 of a batch of 4, kept, give the logits they gave in it."""
    model = tiny_causal_lm(arch)
    engine = TargetEngine(model, [], max_len=32, batch=4)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 300, (k,), generator=gen).tolist() for k in (12, 5, 17, 9)]
    lengths = torch.tensor([len(p) for p in prompts])
    ids = torch.tensor([[7]] * 4)  # [4, 1]: one more token after each prompt

    _, _, _, pad = engine.prefill_rows(prompts)
    want, _ = engine.rows_forward(ids, pad, lengths)  # [4, 1, V]
    _, _, _, pad = engine.prefill_rows(prompts)
    kept = torch.tensor([2, 0])
    engine.keep_rows(kept)
    got, _ = engine.rows_forward(ids[kept], pad[kept], lengths[kept])  # [2, 1, V]
    torch.testing.assert_close(got, want[kept])
    assert not torch.allclose(got[0], want[0])  # row 2's logits are its own, not row 0's


def _cut(row: list[int], stop: set[int]) -> list[int]:
    """A row up to and including its first stop id."""
    end = next((i + 1 for i, t in enumerate(row) if t in stop), len(row))
    return row[:end]


@pytest.mark.slow
@pytest.mark.parametrize("graphs", [False, True])
def test_a_batch_shrinks_to_its_running_rows_and_answers_as_before(monkeypatch, graphs):
    """With `shrink` (synth --shrink-batches), rows that stop early leave the batch: the live ones
    move to the front of the cache and the steps go on over 2, then 1 row (MIN_ROWS 1 here). Each row's tokens up to its stop id are
    still HF `generate`'s on that prompt alone, eagerly and through the graphs' calling
    convention, whose captures mid-generation write their warm-up's K/V (`graph_example`) where
    the next step writes. A model whose answers follow their context: rows 0, 1 and 3 stop at
    their eleventh, third and fifth token; row 2 runs to the end."""
    import draftsmith.synth.generate as gen_mod

    monkeypatch.setattr(gen_mod, "MIN_ROWS", 1)
    monkeypatch.setattr(gen_mod, "CHECK_EVERY", 2)
    model = tiny_causal_lm("llama")
    prompts = [[p % 300 for p in prompt] for prompt in _prompts()]
    refs = [_hf_greedy(model, p, 20) for p in prompts]
    stop = {refs[0][10], refs[1][2], refs[3][4]}
    assert [_cut(r, stop) for r in refs] == [refs[0][:11], refs[1][:3], refs[2], refs[3][:5]], "pick other stop ids"
    engine = TargetEngine(model, [], max_len=64, batch=4)
    if graphs:

        def capture(t: int, width: int, rows: int | None = None, at: int = 0) -> None:
            engine._forward(*engine.graph_example(t, width, rows or engine.batch, at))  # what the warm-up writes
            engine.graphs.setdefault((rows or engine.batch, t, width), engine._forward)

        monkeypatch.setattr(engine, "graph", capture)
    moves = []
    keep_rows = engine.keep_rows
    monkeypatch.setattr(engine, "keep_rows", lambda rows: (moves.append(rows.tolist()), keep_rows(rows)))
    assert generate(engine, prompts, _greedy(20), stop, pad_id=0, seed=0) == refs  # by default, every row to the end
    assert not moves
    out = generate(engine, prompts, _greedy(20), stop, pad_id=0, seed=0, shrink=True)
    assert [_cut(row, stop) for row in out] == [_cut(row, stop) for row in refs]
    assert out[1][6:] == [0] * 14  # left at the check after step 6 (live rows 2 of 4): pad after
    assert [len(m) for m in moves] == [2, 1]
    if graphs:
        assert sorted(engine.graphs) == [(1, 1, 64), (2, 1, 64), (4, 1, 64)]


def test_engine_without_aux_layers(engine):
    ids = torch.tensor([[5, 6, 7]] * 4)
    slots = torch.arange(3)
    logits, aux = engine.forward_batch(ids, slots.repeat(4, 1), slots, engine.causal_mask(0, 3)[None].repeat(4, 1, 1))
    assert logits.shape == (4, 3, engine.vocab_size) and aux.shape == (4, 3, 0)


@pytest.mark.slow
def test_sampling_is_seeded_and_cut_by_top_k_and_top_p(engine, refs):
    prompts, hot = _prompts(), Sampling(1.0, 1.0, 0, 8, 0)
    a = generate(engine, prompts, hot, set(), 0, seed=1)
    assert a == generate(engine, prompts, hot, set(), 0, seed=1)
    assert a != generate(engine, prompts, hot, set(), 0, seed=2)
    greedy = [r[:8] for r in refs]
    assert generate(engine, prompts, Sampling(1.0, 1.0, 1, 8, 0), set(), 0, seed=1) == greedy  # top-k 1
    assert generate(engine, prompts, Sampling(1.0, 1e-6, 0, 8, 0), set(), 0, seed=1) == greedy  # top-p ~0


def test_all_rows_stopped_ends_the_loop(engine, refs):
    stop = {row[0] for row in refs}  # every row stops at its first token
    out = generate(engine, _prompts(), _greedy(20), stop, 0, seed=0)
    assert [len(row) for row in out] == [CHECK_EVERY] * 4  # not 20: checked every CHECK_EVERY steps
    assert [row[0] for row in out] == [row[0] for row in refs]


def _chat(q: str) -> Request:
    return Request(f"{q}/a0", messages=[{"role": "user", "content": q}])


def test_fused_engine_generates_as_the_unfused_one(tiny_target):
    """synth --fuse-target (the GPU default; off on a CPU): the engine's q/k/v and gate/up as one
    product each, the same greedy answers in float32."""
    requests = [_chat(q) for q in ("hi", "What is two plus two?", "Tell me a story about owls.")]
    unfused = LocalBackend(tiny_target, batch_size=3, generator="engine")
    fused = LocalBackend(tiny_target, batch_size=3, generator="engine", fuse=True)
    want, got = unfused.generate(requests, _greedy(8)), fused.generate(requests, _greedy(8))
    assert fused.engine.fused and not unfused.engine.fused
    assert [g.text for g in got] == [g.text for g in want]


def test_shrink_batches_reaches_the_generator(tiny_target, monkeypatch):
    """synth --shrink-batches (SynthConfig.shrink_batches, off by default) is what the local
    backend hands the engine's generator."""
    import draftsmith.synth.local as local_mod

    calls = []
    monkeypatch.setattr(local_mod, "engine_generate", lambda *args: calls.append(args[-1]) or [[1]] * len(args[1]))
    for shrink in (False, True):
        LocalBackend(tiny_target, batch_size=2, generator="engine", shrink=shrink).generate([_chat("hi")], _greedy(2))
    assert calls == [False, True]
    assert SynthConfig(prompts="x.jsonl", target="t", out="o.jsonl").shrink_batches is False


def test_compile_target_reaches_the_engine(tiny_target, monkeypatch):
    """synth --compile-target (SynthConfig.compile_target, off by default) builds the local
    engine with its decode graphs compiled layer by layer; on a CPU nothing is compiled, and the
    answers are the eager ones."""
    import draftsmith.synth.local as local_mod

    assert SynthConfig(prompts="x.jsonl", target="t", out="o.jsonl").compile_target is False
    asked = []
    monkeypatch.setattr(
        local_mod,
        "TargetEngine",
        lambda *a, **kw: asked.append(kw["compile"]) or TargetEngine(*a, **kw),
    )
    answers = {}
    for compile in (False, True):
        backend = LocalBackend(tiny_target, batch_size=2, generator="engine", compile=compile)
        answers[compile] = [g.text for g in backend.generate([_chat("hi"), _chat("What is two plus two?")], _greedy(6))]
        assert not backend.engine.compiled  # a CPU compiles nothing
        assert backend.engine.compile_scope == "layers"
    assert asked == [False, True]
    assert answers[True] == answers[False]


@pytest.mark.slow
def test_backend_picks_and_reuses_the_engine(tiny_target, tokenizer, monkeypatch):
    assert LocalBackend(tiny_target).use_engine  # auto: the engine on CPU too
    assert not LocalBackend(tiny_target, generator="hf").use_engine
    backend = LocalBackend(tiny_target, batch_size=3, generator="engine")
    requests = [_chat(q) for q in ("hi", "x", "What is two plus two?", "Tell me a story about owls.")]
    backend.generate(requests[:2], _greedy(4))
    first = backend.engine
    assert first is not None and first.batch == 2
    backend.generate(requests[:1], _greedy(4))
    assert backend.engine is first  # a smaller batch fills dummy rows
    backend.generate(requests, _greedy(4))
    assert backend.engine is not first and backend.engine.batch == 3

    monkeypatch.setattr(tiny_target, "device", torch.device("cuda"))  # what auto decides on a GPU
    assert uses_engine(tiny_target, "auto")
    monkeypatch.setattr(tiny_target.model.generation_config, "repetition_penalty", 1.1)  # only HF generate applies it
    assert not uses_engine(tiny_target, "auto") and uses_engine(tiny_target, "engine")

    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=len(tokenizer))).eval()
    other = target_from_model(gpt2, tokenizer, name="tiny-gpt2")
    monkeypatch.setattr(other, "device", torch.device("cuda"))
    assert not uses_engine(other, "auto")
    with pytest.raises(UserError, match="--generator hf"):
        uses_engine(other, "engine")


@pytest.mark.slow
def test_chunked_prefill_equals_one_prefill(engine, refs, monkeypatch):
    """A batch of long prompts is prefilled in chunks of prompt slots (PREFILL_CELLS): with
    chunks of one and of three slots the tokens are those of HF `generate`."""
    import draftsmith.synth.generate as gen_mod

    for cells in (engine.batch * 64, 3 * engine.batch * 64):  # rows x chunk x S, S = 64 here
        monkeypatch.setattr(gen_mod, "PREFILL_CELLS", cells)
        assert generate(engine, _prompts(), _greedy(20), set(), pad_id=0, seed=0) == refs


def _varlen_reference(q, k, v, meta, scale):
    """What FlashAttention's variable-length forward computes (`engine.flash_varlen`), in plain
    torch: sequence i's one token (q[i], g heads) attends over keys cum_k[i] .. cum_k[i] + used[i] - 1
    of k, v [M, 1, hd]; returns [N, g, hd]."""
    j = torch.arange(meta.width)  # [W]
    idx = (meta.cum_k[:-1, None].long() + j).clamp(max=k.shape[0] - 1)  # [N, W]
    keys, values = k[idx, 0], v[idx, 0]  # [N, W, hd]
    scores = torch.einsum("ngd,nwd->ngw", q, keys) * (scale or q.shape[-1] ** -0.5)
    scores = scores.masked_fill(j >= meta.used[:, None, None], float("-inf"))
    return torch.einsum("ngw,nwd->ngd", scores.softmax(-1), values)


@pytest.mark.slow
def test_flash_decode_generates_as_the_masked_attention(tiny_model, refs, monkeypatch):
    """`flash_decode` (synth --flash-decode): every one-token step reads its rows' slots as
    variable-length sequences, one per (row, KV head), with no mask. Its index arithmetic, run
    through a plain-torch stand-in for the kernel (which needs a GPU: tests/gpu), gives HF
    `generate`'s tokens: through the graphs' calling convention (every slot of the width), with
    dummy rows, with prompts prefilled one slot at a time (padding slots that see only
    themselves), and with the batch shrinking to its running rows."""
    import draftsmith.runtime.engine as engine_mod
    import draftsmith.synth.generate as gen_mod

    calls = []
    monkeypatch.setattr(engine_mod, "flash_varlen", lambda *a: calls.append(a[3].width) or _varlen_reference(*a))
    engine = TargetEngine(tiny_model, [], max_len=64, batch=4, flash_decode=True)
    monkeypatch.setattr(
        engine,
        "graph",
        lambda t, width, rows=None, at=0: engine.graphs.setdefault((rows or 4, t, width), engine._forward),
    )
    prompts = _prompts()
    assert generate(engine, prompts, _greedy(20), set(), pad_id=0, seed=0) == refs
    assert calls and set(calls) == {64}  # every decode step, each layer, over the graph's 64 slots
    assert generate(engine, prompts[:3], _greedy(20), set(), pad_id=0, seed=0) == refs[:3]  # a dummy row
    monkeypatch.setattr(gen_mod, "PREFILL_CELLS", engine.batch * 64)  # prefill chunks of one slot: steps of one token
    calls.clear()
    assert generate(engine, prompts, _greedy(20), set(), pad_id=0, seed=0) == refs
    assert len(calls) == 2 * (max(LENGTHS) + 19)  # 2 layers x (11 prompt slots + 19 decode steps)
    monkeypatch.setattr(gen_mod, "MIN_ROWS", 1)
    monkeypatch.setattr(gen_mod, "CHECK_EVERY", 2)
    stop = {refs[1][2]}
    out = generate(engine, prompts, _greedy(20), stop, pad_id=0, seed=0, shrink=True)
    assert [_cut(row, stop) for row in out] == [_cut(row, stop) for row in refs]


def test_refilled_rows_sample_seeded_and_cut_by_top_k(tiny_model, monkeypatch):
    """Sampled answers of refilled rows repeat under the same seed and differ under another; top-k 1
    gives the greedy answers (9 prompts through 4 rows, answers of 12 tokens: 5 prompts placed in
    rows freed in the pass)."""
    gen = torch.Generator().manual_seed(2)
    prompts = [torch.randint(3, 1000, (k,), generator=gen).tolist() for k in (2, 5, 3, 8, 1, 6, 4, 7, 9)]
    engine = TargetEngine(tiny_model, [], max_len=refill_width(9, 12), batch=4)
    placed, place = [], engine.place
    monkeypatch.setattr(
        engine, "place", lambda scratch, rows, at: (placed.extend(rows.tolist()), place(scratch, rows, at))
    )
    hot = Sampling(1.0, 1.0, 0, 12, 0)
    first = generate_refilling(engine, prompts, hot, set(), 0, seed=1)
    assert len(placed) == 5
    assert generate_refilling(engine, prompts, hot, set(), 0, seed=1) == first
    assert generate_refilling(engine, prompts, hot, set(), 0, seed=2) != first
    greedy = generate_refilling(engine, prompts, _greedy(12), set(), 0, seed=1)
    assert generate_refilling(engine, prompts, Sampling(1.0, 1.0, 1, 12, 0), set(), 0, seed=3) == greedy
    assert all(len(row) == 12 for row in first + greedy)


def test_a_flash_step_that_fails_decodes_through_the_mask(tiny_model, refs, monkeypatch, capsys):
    """Flash decoding is a default: where its kernel fails on a GPU that `flash_decode_problem` let
    through, the engine says so on stderr and captures the masked step from then on, so the default
    never ends a synth that the masked path runs. Emulated on CPU: the kernel raises, and a
    stand-in for `Graphed` runs its warm-up and returns the function."""
    import draftsmith.runtime.engine as engine_mod

    def unsupported(*_args):
        raise RuntimeError("FlashAttention only supports Ampere GPUs or newer.")

    def warm_up_only(fn, *example):
        with torch.no_grad():
            fn(*example)
        return fn

    monkeypatch.setattr(engine_mod, "flash_varlen", unsupported)
    monkeypatch.setattr(engine_mod, "Graphed", warm_up_only)
    engine = TargetEngine(tiny_model, [], max_len=64, batch=4, flash_decode=True)
    captured = engine._capture(engine._forward, *engine.graph_example(1, 64, 4))
    assert not engine.flash_decode and "flash decoding failed (RuntimeError: FlashAttention" in capsys.readouterr().err
    monkeypatch.setattr(
        engine, "graph", lambda t, width, rows=None, at=0: engine.graphs.setdefault((4, t, width), captured)
    )
    assert generate(engine, _prompts(), _greedy(20), set(), pad_id=0, seed=0) == refs


@pytest.mark.slow
@pytest.mark.parametrize("path", ["eager", "graphs", "flash", "window"])
def test_refilled_rows_answer_as_each_prompt_alone(monkeypatch, path):
    """`generate_refilling` (synth --refill-batches): 10 prompts through 4 rows, each row taking the
    next prompt once its answer has ended (a look every 2 steps), prefilled in a scratch cache
    and placed to end at the slot before the step's. Every answer up to its stop id is HF
    `generate`'s on that prompt alone: eagerly, through the graphs' calling convention, and
    through flash decoding's sequences (the kernel's plain-torch stand-in), which need each row's
    slots to stay one contiguous run, and under a sliding window (Mistral: the placed tokens keep
    their positions). All in one pass from slot 0, with refills placed."""
    import draftsmith.runtime.engine as engine_mod
    import draftsmith.synth.generate as gen_mod

    monkeypatch.setattr(gen_mod, "CHECK_EVERY", 2)
    model = tiny_causal_lm("mistral" if path == "window" else "llama")
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 300, (k,), generator=gen).tolist() for k in (1, 3, 6, 11, 2, 9, 4, 7, 5, 8)]
    refs = [_hf_greedy(model, p, 20) for p in prompts]
    stop = {refs[1][2], refs[4][6]}
    assert sum(len(_cut(r, stop)) < 20 for r in refs) >= 3, "pick other stop ids"
    if path == "flash":
        monkeypatch.setattr(engine_mod, "flash_varlen", _varlen_reference)
    engine = TargetEngine(model, [], max_len=refill_width(11, 20), batch=4, flash_decode=path == "flash")
    if path != "eager":  # a graph is the forward over the whole width
        monkeypatch.setattr(
            engine, "graph", lambda t, width, rows=None, at=0: engine.graphs.setdefault((4, t, width), engine._forward)
        )
    placed, passes = [], []
    place, prefill = engine.place, gen_mod.prefill
    monkeypatch.setattr(engine, "place", lambda scratch, rows, at: (placed.append(at), place(scratch, rows, at)))
    monkeypatch.setattr(
        gen_mod, "prefill", lambda e, p, pad_id, s, rows=None: passes.append(s) or prefill(e, p, pad_id, s, rows)
    )
    out = generate_refilling(engine, prompts, _greedy(20), stop, pad_id=0, seed=0)
    assert [_cut(row, stop) for row in out] == [_cut(row, stop) for row in refs]
    assert all(len(row) == 20 or stop & set(row) for row in out)  # the caller cuts at the stop id
    assert passes.count(engine.max_len) == 1 and len(placed) >= 3


def test_flash_decode_refuses_what_it_cannot_attend(tiny_model):
    """No sliding window (Mistral) or soft-capped scores (Gemma-2) through the mask-free kernel;
    `flash_decode_problem` names that first, then where the kernel itself cannot run."""
    from draftsmith.runtime.engine import flash_decode_problem

    mistral = tiny_causal_lm("mistral", sliding_window=4)
    with pytest.raises(UserError, match="flash decoding: it covers no sliding-window attention"):
        TargetEngine(mistral, [], max_len=64, flash_decode=True)
    assert "sliding-window" in flash_decode_problem(mistral)
    gemma2_global = tiny_causal_lm("gemma2", layer_types=["full_attention"] * 2)  # soft-capped, no window
    assert flash_decode_problem(gemma2_global) == "it covers no soft-capped attention scores"
    assert flash_decode_problem(tiny_model) == "it runs on CUDA GPUs only"


def test_flash_decode_is_auto_and_off_a_gpu_says_what_to_do(tiny_target):
    """synth's flash decoding (SynthConfig.flash_decode) is None by default: on wherever its kernel
    runs, so off on a CPU (and under HF generate); asked for there (--flash-decode), it is refused
    before any generation, with the reason and the way out."""
    assert SynthConfig(prompts="x.jsonl", target="t", out="o.jsonl").flash_decode is None
    assert LocalBackend(tiny_target, batch_size=2, generator="engine").flash is False
    assert LocalBackend(tiny_target, batch_size=2, generator="engine", flash=False).flash is False
    with pytest.raises(UserError, match="--flash-decode: it needs the local engine; drop the option"):
        LocalBackend(tiny_target, batch_size=2, generator="hf", flash=True)
    with pytest.raises(UserError, match="--flash-decode: it runs on CUDA GPUs only; drop the option"):
        LocalBackend(tiny_target, batch_size=2, generator="engine", flash=True)
