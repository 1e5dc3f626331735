"""The engine self-check (runtime/selfcheck.py), the engine it chooses (runtime/engine_choice.py)
and the generic engine (runtime/generic.py) on tiny random models: Granite (embedding, residual and logit multipliers) fails the check, gets the
generic path, and eval's greedy speculative output equals `model.generate`; Llama and Mistral
(a sliding window shorter than the context) pass and keep the fast engine, whose output equals
`generate` past the window; the check's prompt goes past the window, so an engine without it
fails. GPU synth refuses or avoids the fast engine for the failing ones."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch

from draftsmith.errors import UserError
from draftsmith.evaluate.decode import decode, plain_generate, spec_generate
from draftsmith.evaluate.proposer import DrafterProposer, OracleProposer
from draftsmith.layers import default_aux_layers
from draftsmith.runtime import engine as engine_module
from draftsmith.runtime import selfcheck
from draftsmith.runtime.engine import TargetEngine
from draftsmith.runtime.engine_choice import open_engine
from draftsmith.runtime.generic import HFEngine
from draftsmith.runtime.sampling import Sampling
from draftsmith.runtime.selfcheck import config_gaps, fast_engine_problem, logits_gap
from draftsmith.synth.local import uses_engine
from draftsmith.target import decoder_layers, target_from_model
from tests.helpers import WINDOW, make_tiny_llama, random_drafter, tiny_causal_lm

V, NEW = 300, 24


def tiny(kind: str, vocab_size: int = V):
    """A 2-layer random-weight decoder of `kind` (tests/helpers.py): Granite has real Granite's
    kind of multipliers, Mistral a sliding window of WINDOW tokens."""
    return make_tiny_llama(vocab_size) if kind == "llama" else tiny_causal_lm(kind, vocab_size)


def aux_ids(model) -> list[int]:
    return default_aux_layers(len(decoder_layers(model)))


def hf_greedy(model, prompt: list[int], new: int) -> list[int]:
    out = model.generate(
        torch.tensor([prompt]),
        do_sample=False,
        max_new_tokens=new,
        min_new_tokens=new,
        eos_token_id=None,
        pad_token_id=0,
    )
    return out[0, len(prompt) :].tolist()


PROMPTS = [torch.randint(3, V, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in (5, 11)]


def test_llama_passes_and_keeps_the_fast_engine(capsys):
    model = tiny("llama")
    assert config_gaps(model) == [] and fast_engine_problem(model, aux_ids(model), 4096) is None
    assert isinstance(open_engine(model, aux_ids(model), 256, mode="tree"), TargetEngine)
    assert capsys.readouterr().err == ""


def test_check_fails_on_config_and_on_logits_alone():
    model = tiny("granite")
    assert any(g.startswith("embedding_multiplier=12.0") for g in config_gaps(model))
    assert "logits differ" in logits_gap(model, aux_ids(model))  # the guard catches it without the config check
    assert "embedding_multiplier=12.0" in fast_engine_problem(model, aux_ids(model), 64)


def test_the_check_covers_the_sliding_window(monkeypatch):
    """Mistral's WINDOW-token window passes the check; an engine that ignores the window fails
    it, on a run longer than the window, because the check's prompt then goes past the window."""
    model = tiny("mistral")
    assert config_gaps(model) == [] and fast_engine_problem(model, aux_ids(model), 64) is None
    monkeypatch.setattr(engine_module, "sliding_layers", lambda m: (None, [False] * len(decoder_layers(m))))
    assert "logits differ" in fast_engine_problem(model, aux_ids(model), 64)
    for name in ("CHECK_PREFILL", "CHECK_CHAIN"):  # a prompt of WINDOW tokens, for a run of as many
        monkeypatch.setattr(selfcheck, name, WINDOW // 2)
    assert fast_engine_problem(model, aux_ids(model), WINDOW) is None  # within the window, it cannot tell


@pytest.mark.slow
@pytest.mark.parametrize("kind, mode", [("granite", "chain"), ("mistral", "chain"), ("mistral", "tree")])
def test_greedy_equals_generate_on_the_engine_open_engine_picks(kind, mode, capsys):
    """eval's decoding on the engine open_engine picks (Granite: generic; Mistral: fast, with its
    window): plain and speculative (random drafter: every draft rejected; oracle of a corrupted
    reference: 0..2 of 3 accepted, so the cache is cropped or compacted by every amount) equal
    the model's own greedy `generate`, past the sliding window."""
    model = tiny(kind)
    engine = open_engine(model, aux_ids(model), 128, mode=mode)
    err = capsys.readouterr().err
    if kind == "granite":
        assert isinstance(engine, HFEngine)
        assert f"{type(model).__name__}: not on the fast engine" in err and "generic path" in err
    else:
        assert isinstance(engine, TargetEngine) and err == ""
    drafter = DrafterProposer(
        random_drafter(model), Sampling(), engine.max_len, mode=mode, depth=3, top_k=3, total_tokens=8
    )
    for prompt in PROMPTS:
        ref = hf_greedy(model, prompt, NEW)
        assert plain_generate(engine, prompt, NEW, set(), Sampling()).tokens == ref
        assert spec_generate(engine, drafter, prompt, NEW, set(), Sampling()).tokens == ref
        seq = prompt + ref
        wrong = [t if i < len(prompt) or i % 3 else (t + 1) % V for i, t in enumerate(seq)]
        spec = spec_generate(engine, OracleProposer(wrong, mode=mode, depth=3), prompt, NEW, set(), Sampling())
        assert spec.tokens == ref and {0, 1, 2} <= set(spec.accepts)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["chain", "tree"])
def test_windowed_rows_of_other_lengths_decode_as_generate(mode):
    """Mistral on the fast engine with two rows (`eval --batch-size 2`): the shorter prompt is
    left-padded, so its slots and positions differ, and the window goes by position. Each row's
    plain and speculative greedy answer equals `generate`, past the window."""
    model = tiny("mistral")
    engine = open_engine(model, aux_ids(model), 128, mode=mode, batch=2)
    assert isinstance(engine, TargetEngine)
    drafter = DrafterProposer(
        random_drafter(model), Sampling(), engine.max_len, mode=mode, depth=3, top_k=3, total_tokens=8, batch=2
    )
    refs = [hf_greedy(model, prompt, NEW) for prompt in PROMPTS]
    assert [t.tokens for t in decode(engine, PROMPTS, NEW, set(), Sampling())] == refs
    assert [t.tokens for t in decode(engine, PROMPTS, NEW, set(), Sampling(), drafter)] == refs


@pytest.mark.parametrize("kind", ["granite", "mistral"])
def test_generic_engine_crops_and_captures_layer_ids(kind):
    """A rejected suffix cropped away, then a different continuation: logits and aux states
    equal one uncached forward (aux id k < L = output_hidden_states[k])."""
    model = tiny(kind)
    ids = torch.randint(3, V, (20,), generator=torch.Generator().manual_seed(0))
    engine = HFEngine(model, [0, 1], 64)
    engine.prefill(ids[:10])
    engine.chain(torch.tensor([7, 8, 9, 10, 11]), 10)  # a draft of which only the first token will be kept
    engine.chain(ids[10:11], 10)
    logits, aux = engine.chain(ids[11:], 11)
    ref = model(ids[None], output_hidden_states=True)
    assert torch.allclose(logits, ref.logits[0, 11:], atol=1e-4)
    assert torch.allclose(aux, torch.cat([ref.hidden_states[k][0, 11:] for k in (0, 1)], dim=-1), atol=1e-4)


def test_tree_on_the_generic_path_runs_or_is_refused_with_the_reason():
    """Granite (off the fast engine by its multipliers) verifies trees on the generic path;
    gpt-oss (off it too) has sliding-window cache layers, which cannot, and `--mode tree` says so."""
    granite = tiny("granite")
    assert isinstance(open_engine(granite, aux_ids(granite), 128, mode="tree"), HFEngine)
    gpt_oss = tiny("gpt_oss")
    with pytest.raises(UserError, match="--mode tree on GptOssForCausalLM: .*sliding-window layers.*--mode chain"):
        open_engine(gpt_oss, aux_ids(gpt_oss), 128, mode="tree")


def test_synth_takes_generate_or_refuses_when_the_check_fails(tokenizer, capsys):
    """Synth never writes the fast engine's tokens for a target that fails the check: `auto`
    takes HF `generate` and says why, `--generator engine` is refused; a target that passes it
    gets the engine, on a GPU as on the CPU."""
    on_cuda = lambda model: dataclasses.replace(target_from_model(model, tokenizer), device=torch.device("cuda"))  # noqa: E731
    granite = on_cuda(tiny("granite", len(tokenizer)))
    assert not uses_engine(granite, "auto")
    assert "[synth] GraniteForCausalLM: not on the fast engine" in capsys.readouterr().err
    with pytest.raises(UserError, match="--generator engine: .*GraniteForCausalLM"):
        uses_engine(granite, "engine")
    assert uses_engine(on_cuda(tiny("llama", len(tokenizer))), "auto")
    assert uses_engine(target_from_model(tiny("llama", len(tokenizer)), tokenizer), "auto")  # CPU


@pytest.mark.slow
def test_cli_eval_on_the_generic_path(tmp_path, tokenizer):
    """`draftsmith eval` on a saved Granite: the report says which engine ran and why, greedy
    speculative turns equal plain ones, chain and tree (a 4-D tree mask on the generic path)."""
    import json

    from typer.testing import CliRunner

    from draftsmith.cli import app
    from draftsmith.draft.checkpoint import save_drafter

    model = tiny("granite", len(tokenizer))
    model.save_pretrained(tmp_path / "granite")
    tokenizer.save_pretrained(tmp_path / "granite")
    drafter = save_drafter(random_drafter(model, draft_vocab_size=1000), tmp_path / "drafter")
    (tmp_path / "q.jsonl").write_text(json.dumps({"turns": ["What is 2+2?", "And 3+3?"]}) + "\n")
    args = [
        "eval",
        "--target",
        str(tmp_path / "granite"),
        "--drafter",
        str(drafter),
        "--bench",
        str(tmp_path / "q.jsonl"),
        "--depth",
        "3",
        "--max-new-tokens",
        "12",
    ]
    for mode in ("chain", "tree"):
        res = CliRunner().invoke(app, [*args, "--out", str(tmp_path / mode), "--mode", mode])
        assert res.exit_code == 0, res.output
        report = json.loads((tmp_path / mode / "report.json").read_text())
        assert report["target_engine"] == "generic" and "embedding_multiplier" in report["generic_engine_reason"]
        assert report["greedy_turns_matching_plain"] == report["turns"] == 2


def test_a_model_that_ignores_the_tree_mask_gets_no_generic_tree(tiny_model, monkeypatch):
    """The generic tree check runs two siblings in one forward: if the 4-D mask were ignored
    (here: dropped on the way to the model), the second sibling would see the first, and
    `--mode tree` is refused on that model instead of decoding wrong drafts."""
    from draftsmith.runtime.generic import HFEngine
    from draftsmith.runtime.selfcheck import generic_tree_problem

    engine = HFEngine(tiny_model, [1, 2], 64)
    assert generic_tree_problem(engine) is None
    real = HFEngine._run
    monkeypatch.setattr(HFEngine, "_run", lambda self, ids, pos, mask=None: real(self, ids, pos))
    assert "does not honour a 4-D attention mask" in generic_tree_problem(engine)


@pytest.mark.parametrize("kind", ["llama", "mistral"])
def test_fused_projections_decode_as_the_model(kind):
    """`TargetEngine(fuse=True)` (q/k/v as one product, gate/up as another: bench/eval_bench.py
    --fuse-ab) fuses every layer, holds those weights once (the model's are views of the fused
    ones), gives the unfused engine's logits to float32 rounding, and decodes greedily as the
    model's own `generate`, plain and speculative. On a CPU the default is unfused."""
    model = tiny(kind)
    fused = TargetEngine(model, aux_ids(model), 128, fuse=True)
    plain = TargetEngine(model, aux_ids(model), 128)
    assert all(f is not None for f in fused.qkv + fused.gate_up)
    assert all(q is None for q in plain.qkv + plain.gate_up)
    for layer, (qkv, _), (gate_up, _) in zip(decoder_layers(model), fused.qkv, fused.gate_up, strict=True):
        for w, whole in ((layer.self_attn.k_proj.weight, qkv), (layer.mlp.up_proj.weight, gate_up)):
            assert w.untyped_storage().data_ptr() == whole.untyped_storage().data_ptr()
    ids = torch.tensor(PROMPTS[1])
    got, want = fused.prefill(ids)[0], plain.prefill(ids)[0]  # logits [T, V]
    assert torch.allclose(got, want, atol=1e-4, rtol=1e-4)
    drafter = DrafterProposer(random_drafter(model), Sampling(), fused.max_len, mode="chain", depth=3)
    for prompt in PROMPTS:
        ref = hf_greedy(model, prompt, NEW)
        assert plain_generate(fused, prompt, NEW, set(), Sampling()).tokens == ref
        assert spec_generate(fused, drafter, prompt, NEW, set(), Sampling()).tokens == ref


def test_fusion_leaves_what_is_not_a_plain_linear_layer():
    """A layer whose q_proj is a subclass of nn.Linear (a quantised layer's shape) keeps its
    separate products, and so does one whose k_proj weight has another dtype; the MLPs fuse."""

    class Quantised(torch.nn.Linear):
        pass

    model = tiny("llama").to(torch.bfloat16)  # bf16: no layer prepacked (runtime/linear.py)
    attn0, attn1 = (layer.self_attn for layer in decoder_layers(model)[:2])
    q = attn0.q_proj
    attn0.q_proj = Quantised(q.in_features, q.out_features, bias=q.bias is not None, dtype=torch.bfloat16)
    attn1.k_proj.to(torch.float32)
    engine = TargetEngine(model, aux_ids(model), 64, fuse=True)
    assert engine.qkv == [None, None]
    assert all(f is not None for f in engine.gate_up)


def test_compiled_forward_writes_the_kv_cache_in_place():
    """The target's forward compiled by inductor (eval's compiled target, here its CPU backend)
    writes each layer's new keys and values into the cache in place: it allocates no buffer of a
    cache layer's shape. The KV write as `scatter_` was compiled into an out-of-place scatter and a
    copy of the whole layer's cache back, two of them a layer (11.4 ms of a 16 ms step at 1,024
    rows on an H100)."""
    from torch._inductor.utils import run_and_get_code

    model = make_tiny_llama(V).to(torch.bfloat16)  # bf16: no prepacked layer, which inductor cannot lower
    engine = TargetEngine(model, [], 96, batch=2)
    ids = torch.zeros(2, 1, dtype=torch.long)
    pos = torch.zeros(2, 1, dtype=torch.long)
    with torch.no_grad():
        _, code = run_and_get_code(
            torch.compile(engine._forward, dynamic=False),
            ids,
            pos,
            pos,
            engine.causal_mask(0, 1)[None].repeat(2, 1, 1, 1),
        )
    layer = ", ".join(map(str, engine.k_cache[0].shape))  # B, nkv, max_len, hd
    assert not re.search(rf"empty_strided_\w+\(\({layer}\)", "".join(code))


@pytest.mark.slow
@pytest.mark.skipif(__import__("shutil").which("g++") is None, reason="inductor's CPU backend needs a C++ compiler")
def test_layer_compiled_forward_equals_eager_compiles_once_and_writes_the_cache_in_place():
    """compile_scope="layers" (`layers_compiled`): every layer runs one compiled step, so a
    shape compiles one frame for all the layers (a second call of that shape compiles none); the
    logits, aux states and the keys and values written equal the eager forward's; and the step
    writes the layer's cache in place (no buffer of a cache layer's shape: the whole-cache copy
    that a compiled `scatter_` made)."""
    from torch._inductor.utils import run_and_get_code

    model = make_tiny_llama(V, num_layers=4).to(torch.bfloat16)  # bf16: no prepacked layer, which inductor cannot lower
    engines = [TargetEngine(model, [0, 2, 4], 96, batch=2, compile_scope="layers") for _ in range(2)]
    ids = torch.tensor([[5], [7]])
    pos = torch.tensor([[3], [4]])
    mask = engines[0].causal_mask(0, 1)[None].repeat(2, 1, 1, 1)  # [2, 1, 1, 96]
    frames = torch._dynamo.utils.counters["frames"]
    with torch.no_grad():
        want = engines[0]._forward(ids, pos, pos, mask)
        with engines[1].layers_compiled():
            before = frames["total"]
            got, code = run_and_get_code(engines[1]._forward, ids, pos, pos, mask)
            assert frames["total"] - before == 1  # one frame: the step every layer runs
            before = frames["total"]
            engines[1]._forward(ids, pos, pos, mask)
            assert frames["total"] == before
    assert engines[1].layer_step == engines[1]._block  # eager again outside
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(engines[1].kv, engines[0].kv, atol=2e-2, rtol=2e-2)
    layer = ", ".join(map(str, engines[1].k_cache[0].shape))  # B, nkv, max_len, hd
    assert not re.search(rf"empty_strided_\w+\(\({layer}\)", "".join(code))
