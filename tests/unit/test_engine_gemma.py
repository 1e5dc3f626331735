"""The fast engine (runtime/engine.py) on the Gemma family, tiny random models in fp32:

- Gemma-1 (scaled embedding, (1 + w) norms, gelu-tanh MLP, head_dim != hidden/heads),
  Gemma-2 (sandwich norms, `query_pre_attn_scalar`, attention and logit soft-caps) and
  Gemma-3 (q/k norms, local layers rotating at their own base frequency) with sliding windows
  that cover the run's context pass the self-check: the fast engine's logits and aux states
  equal `model(...)`, and `open_engine` keeps it without a word;
- each of those Gemma features is load-bearing in these models: the engine without it fails
  the self-check (so the passing check above says something);
- a window shorter than the context: still the fast engine, exact past the window (its
  local layers windowed, its global ones not);
- refused with the reason: bidirectional attention, a layer with only part of the sandwich
  norms;
- Gemma-1's eval greedy decoding equals `generate` (Gemma-2/3's: tests/e2e/test_architectures.py).
"""

from __future__ import annotations

import pytest
import torch
import transformers

from draftsmith.errors import UserError
from draftsmith.evaluate.decode import plain_generate, spec_generate
from draftsmith.evaluate.proposer import DrafterProposer, OracleProposer
from draftsmith.runtime import engine as engine_module
from draftsmith.runtime.engine import TargetEngine, check_supported
from draftsmith.runtime.engine_choice import open_engine
from draftsmith.runtime.sampling import Sampling
from draftsmith.runtime.selfcheck import config_gaps, fast_engine_problem, logits_gap
from draftsmith.target import decoder_layers
from tests.helpers import TINY_DIMS, random_drafter, tiny_causal_lm

V, CONTEXT, NEW = 300, 64, 24  # vocab; the run's context (the Gemma-2/3 windows cover it); new tokens decoded
AUX = [0, 1, 2]  # every layer id of the 2-layer models, the last layer's output (id L) included
KINDS = ["gemma", "gemma2", "gemma3"]


def gemma(kind: str, **overrides):
    """A 2-layer random Gemma of `kind` with head_dim 32 (hidden 64 / 4 heads = 16); Gemma-2/3
    have a local and a global layer, a window of CONTEXT tokens and an attention scale
    (query_pre_attn_scalar 24) other than 1/sqrt(head_dim); Gemma-2's soft-caps are low enough
    to bite on random weights (their attention scores are ~0.03)."""
    if kind == "gemma":
        torch.manual_seed(0)
        cfg = transformers.GemmaConfig(**{**TINY_DIMS, "vocab_size": V, "head_dim": 32, **overrides})
        return transformers.GemmaForCausalLM(cfg).eval()
    caps = {"attn_logit_softcapping": 0.05, "final_logit_softcapping": 2.0} if kind == "gemma2" else {}
    return tiny_causal_lm(
        kind,
        V,
        **{
            "head_dim": 32,
            "query_pre_attn_scalar": 24,
            "sliding_window": CONTEXT,
            "layer_types": ["sliding_attention", "full_attention"],
            **caps,
            **overrides,
        },
    )


@pytest.mark.parametrize("kind", KINDS)
def test_gemma_passes_the_check_and_keeps_the_fast_engine(kind, capsys):
    model = gemma(kind)
    assert config_gaps(model) == []
    assert fast_engine_problem(model, AUX, CONTEXT) is None  # logits and the aux states at every id
    assert isinstance(open_engine(model, AUX, CONTEXT, mode="tree"), TargetEngine)
    assert capsys.readouterr().err == ""


# the engine without one Gemma feature: a model that has it, and what to patch (where, name, stand-in)
WITHOUT = {
    "attention soft-cap": (
        lambda: gemma("gemma2"),
        TargetEngine,
        "_capped_attention",
        lambda self, *args: TargetEngine._sdpa(*args),
    ),
    "logit soft-cap": (
        lambda: gemma("gemma2", attn_logit_softcapping=None),
        engine_module,
        "softcap",
        lambda x, cap: x,
    ),
    "sandwich norms": (lambda: gemma("gemma2"), TargetEngine, "_sandwich_block", TargetEngine._prenorm_block),
    "local rotary": (
        lambda: gemma("gemma3"),
        engine_module,
        "rotary_types",
        lambda model: ["full_attention"] * len(decoder_layers(model)),
    ),
}


@pytest.mark.parametrize("feature", list(WITHOUT))
def test_the_check_fails_without_each_gemma_feature(feature, monkeypatch):
    build, where, name, stand_in = WITHOUT[feature]
    model = build()
    monkeypatch.setattr(where, name, stand_in)
    assert "logits differ" in logits_gap(model, AUX)


def test_the_attention_scale_is_the_models():
    """Gemma-2/3 scale scores by query_pre_attn_scalar^-1/2, which the engine takes from the
    attention modules: changed there, the model's logits change and the engine still agrees."""
    model = gemma("gemma3")
    ids = torch.arange(3, 20)[None]  # [1, 17]
    before = model(ids).logits
    for layer in decoder_layers(model):
        layer.self_attn.scaling = 0.5
    assert not torch.allclose(model(ids).logits, before, atol=1e-3)
    assert logits_gap(model, AUX) is None


@pytest.mark.parametrize("kind", ["gemma2", "gemma3"])
def test_a_window_shorter_than_the_context_keeps_the_fast_engine(kind, monkeypatch):
    """The check's prompt goes past the window; the engine passes it, and fails it when its
    global layer is windowed like its local one (the window is per layer type)."""
    model = gemma(kind, sliding_window=8)
    assert fast_engine_problem(model, AUX, CONTEXT) is None
    monkeypatch.setattr(engine_module, "sliding_layers", lambda m: (8, [True] * len(decoder_layers(m))))
    assert "logits differ" in fast_engine_problem(model, AUX, CONTEXT)


def test_bidirectional_attention_is_refused():
    model = gemma("gemma3", use_bidirectional_attention=True)
    assert "use_bidirectional_attention=True" in fast_engine_problem(model, AUX, CONTEXT)


def test_part_of_the_sandwich_norms_is_refused():
    model = gemma("gemma2")
    for layer in decoder_layers(model):
        del layer.post_feedforward_layernorm
    with pytest.raises(UserError, match=r"\['pre_feedforward_layernorm'\] without the rest of Gemma's sandwich norms"):
        check_supported(model)


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


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["chain", "tree"])
def test_gemma_greedy_equals_generate(mode):
    """eval's decoding of Gemma-1 on the fast engine: plain and speculative (random drafter:
    every draft rejected; oracle of a corrupted reference: some accepted) equal `generate`."""
    model = gemma("gemma")
    engine = open_engine(model, random_drafter(model).config.aux_layer_ids, CONTEXT, mode)
    assert isinstance(engine, TargetEngine)
    drafter = DrafterProposer(
        random_drafter(model), Sampling(), engine.max_len, mode=mode, depth=3, top_k=3, total_tokens=8
    )
    prompt = torch.randint(3, V, (11,), generator=torch.Generator().manual_seed(0)).tolist()
    ref = hf_greedy(model, prompt, NEW)
    assert plain_generate(engine, prompt, NEW, set(), Sampling()).tokens == ref
    assert spec_generate(engine, drafter, prompt, NEW, set(), Sampling()).tokens == ref
    wrong = [t if i % 3 else (t + 1) % V for i, t in enumerate(prompt + ref)]
    spec = spec_generate(engine, OracleProposer(wrong, mode=mode, depth=3), prompt, NEW, set(), Sampling())
    assert spec.tokens == ref and max(spec.accepts) > 0
