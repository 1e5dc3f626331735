"""GPU checks of synth's batched static-KV generator (run with --run-gpu on a CUDA machine): the
CUDA-graphed batched decoding gives HF `generate`'s greedy answers on the embedded default in
fp32 (batches of 8 and 4 + 4 dummy rows), also where the batch shrinks to its running rows with
graphs captured mid-generation, where ended rows are refilled with the next prompts, and with each
graph compiled layer by layer, and seeded sampling repeats; flash decoding's default, its way out
and its steps against masked attention in bf16."""

from __future__ import annotations

import json

import pytest
import torch

from draftsmith.assets import GSM8K_TRAIN
from draftsmith.runtime.engine import TargetEngine
from draftsmith.runtime.sampling import Sampling
from draftsmith.synth.local import LocalBackend
from draftsmith.synth.turns import Request
from draftsmith.target import load_target
from tests.helpers import SMOLLM2

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def target():
    return load_target(SMOLLM2, device="cuda", dtype="fp32")


def _requests(n: int) -> list[Request]:
    questions = [json.loads(line)["question"] for line in GSM8K_TRAIN.read_text().splitlines()[:n]]
    return [Request(f"q{i}/a0", messages=[{"role": "user", "content": q}]) for i, q in enumerate(questions)]


@pytest.mark.parametrize(
    ("shrink", "compile", "refill"),
    [(False, False, False), (True, False, False), (False, True, False), (False, False, True)],
)
def test_graphed_batched_greedy_equals_generate(target, monkeypatch, shrink, compile, refill):
    """shrink (synth --shrink-batches): the batch goes down to its running rows (MIN_ROWS 1, a look
    every 4 steps), each smaller graph captured when first needed, in the middle of the batch's
    generation. compile (synth --compile-target): each graph's forward compiled layer by layer.
    refill (synth --refill-batches): 4 rows for 12 prompts, a look every 4 steps, ended rows taking
    the next prompts placed mid-cache by the graphed step's calling convention."""
    import draftsmith.synth.generate as gen_mod

    if shrink or refill:
        monkeypatch.setattr(gen_mod, "MIN_ROWS", 1)
        monkeypatch.setattr(gen_mod, "CHECK_EVERY", 4)
    tok, model = target.tokenizer, target.model
    backend = LocalBackend(target, batch_size=4 if refill else 8, shrink=shrink, compile=compile, refill=refill)
    assert backend.use_engine  # auto picks the engine on CUDA
    requests = _requests(12)
    gens = backend.generate(requests, Sampling(0.0, 1.0, 0, 64, 0))
    assert backend.engine is not None and backend.engine.graphs  # decoded in CUDA graphs
    assert shrink == any(rows < backend.batch_size for rows, _, _ in backend.engine.graphs)
    assert backend.engine.compiled == compile  # no fallback to the eager forward
    stop = sorted(backend.stop)
    for req, gen in zip(requests, gens):
        text = tok.apply_chat_template(req.messages, tokenize=False, add_generation_prompt=True)
        ids = tok(text, add_special_tokens=False, return_tensors="pt")["input_ids"].cuda()
        with torch.inference_mode():
            ref = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=64,
                do_sample=False,
                eos_token_id=stop,
                pad_token_id=stop[0],
            )
        assert gen.text == tok.decode(ref[0, ids.shape[1] :], skip_special_tokens=True), req.key


def test_graphed_sampling_is_seeded(target):
    backend = LocalBackend(target, batch_size=8, generator="engine")
    hot = Sampling(0.8, 0.95, 50, 32, 3)
    a, b = (backend.generate(_requests(8), hot) for _ in range(2))
    assert [g.text for g in a] == [g.text for g in b]


@pytest.fixture(scope="module")
def target_bf16():
    return load_target(SMOLLM2, device="cuda", dtype="bf16")


def test_flash_decode_is_on_by_default_where_it_runs(target, target_bf16):
    """synth's flash decoding by default (SynthConfig.flash_decode None): on for the bf16 target on
    a GPU; off for the fp32 one (the kernel takes 16-bit floats) and under HF generate."""
    assert LocalBackend(target_bf16, batch_size=8).flash is True
    assert LocalBackend(target_bf16, batch_size=8).decoding.startswith(
        "draftsmith's engine in CUDA graphs, flash decoding"
    )
    assert LocalBackend(target, batch_size=8).flash is False
    assert LocalBackend(target_bf16, batch_size=8, generator="hf").flash is False


def test_a_failing_flash_kernel_synthesises_as_the_masked_path(target_bf16, monkeypatch, capsys):
    """The default's way out on a real CUDA graph: where the kernel raises in the warm-up (as its
    own checks do on a GPU they refuse), the engine captures the masked step instead and the
    answers are the masked backend's."""
    import draftsmith.runtime.engine as engine_mod

    greedy = Sampling(0.0, 1.0, 0, 32, 0)
    masked = [g.text for g in LocalBackend(target_bf16, batch_size=8, flash=False).generate(_requests(8), greedy)]

    def unsupported(*_args):
        raise RuntimeError("FlashAttention only supports Ampere GPUs or newer.")

    monkeypatch.setattr(engine_mod, "flash_varlen", unsupported)
    backend = LocalBackend(target_bf16, batch_size=8)
    assert [g.text for g in backend.generate(_requests(8), greedy)] == masked
    assert backend.engine is not None and not backend.engine.flash_decode and "masked attention" in backend.decoding
    assert "flash decoding failed" in capsys.readouterr().err


@pytest.mark.parametrize("compile", [False, True])
def test_flash_decode_steps_match_the_masked_attention(target_bf16, monkeypatch, compile):
    """synth --flash-decode on the embedded default in bf16 (the kernel takes no fp32): every
    graphed decode step's logits, beside the same step run eagerly through masked SDPA over the
    same cache, agree to bf16 rounding, argmax and all; also with each graph compiled layer by
    layer (--compile-target), the kernel inside the compiled step."""
    backend = LocalBackend(target_bf16, batch_size=8, flash=True, compile=compile)
    seen: list[tuple[float, float]] = []

    def checked(forward_batch):
        def run(ids, pos, slots, mask, last_only=False):
            logits, aux = forward_batch(ids, pos, slots, mask, last_only)
            if not last_only and ids.shape[1] == 1:
                got = logits.clone()
                engine.flash_decode = False  # the same step through the mask; it rewrites the same K/V
                want, _ = engine._forward(ids, pos, slots.expand(ids.shape[0], -1), mask[:, None])
                engine.flash_decode = True
                seen.append(
                    (
                        float((got - want).abs().max() / want.abs().max()),
                        float((got.argmax(-1) == want.argmax(-1)).float().mean()),
                    )
                )
            return logits, aux

        return run

    engine = None
    reserve = backend._reserve

    def reserve_and_spy(rows, slots):
        nonlocal engine
        reserve(rows, slots)
        engine = backend.engine
        monkeypatch.setattr(engine, "forward_batch", checked(TargetEngine.forward_batch.__get__(engine)))

    monkeypatch.setattr(backend, "_reserve", reserve_and_spy)
    backend.generate(_requests(8), Sampling(0.0, 1.0, 0, 48, 0))
    assert engine is not None and engine.flash_decode and engine.graphs
    assert engine.compiled == compile  # no fallback to the eager forward
    assert len(seen) >= 40
    worst, agree = max(e for e, _ in seen), sum(a for _, a in seen) / len(seen)
    assert worst < 0.1 and agree > 0.95, (worst, agree)


def test_refilled_rows_with_flash_decoding_answer_as_kept_batches(target_bf16, monkeypatch):
    """synth --refill-batches with flash decoding (the default's kernel) on a real CUDA graph, against
    batches of the same 4 rows kept whole: each refilled row's slots stay one contiguous run, as the
    kernel reads them, so its greedy answer starts as the kept one does (a prompt placed a slot off
    changes it from its first token); bf16 rounding differs with a row's slots and may move a late
    token, so half the answers agree whole."""
    import draftsmith.synth.generate as gen_mod

    monkeypatch.setattr(gen_mod, "CHECK_EVERY", 4)
    greedy = Sampling(0.0, 1.0, 0, 48, 0)
    kept = LocalBackend(target_bf16, batch_size=4).generate(_requests(8), greedy)
    backend = LocalBackend(target_bf16, batch_size=4, refill=True)
    assert backend.flash
    refilled = backend.generate(_requests(8), greedy)
    tok = target_bf16.tokenizer
    firsts = [(tok(a.text)["input_ids"][:8], tok(b.text)["input_ids"][:8]) for a, b in zip(kept, refilled)]
    print("kept / refilled:", *[(a.text[:80], b.text[:80]) for a, b in zip(kept, refilled)], sep="\n")
    assert all(a == b for a, b in firsts)
    assert sum(a.text == b.text for a, b in zip(kept, refilled)) >= 4


def test_rows_fitted_to_the_free_memory_answer_as_the_whole_batch(target, monkeypatch, capsys):
    """On a card with less free memory than a batch's cache needs (here: as if 2.5 rows' worth were
    CACHE_SHARE of it), synth decodes as many rows as fit at a time through CUDA graphs of that many
    rows, and the greedy answers are the whole batch's."""
    import draftsmith.synth.local as local_mod
    from draftsmith.target import text_config
    from draftsmith.vllm_support import kv_bytes_per_token

    greedy = Sampling(0.0, 1.0, 0, 32, 0)
    whole = LocalBackend(target, batch_size=8)
    answers = [g.text for g in whole.generate(_requests(8), greedy)]
    per_token = kv_bytes_per_token(text_config(target.model.config), target.dtype.itemsize)
    room = per_token * whole.engine.max_len * 2.5 / local_mod.CACHE_SHARE
    monkeypatch.setattr(local_mod, "available_memory", lambda device: int(room))
    fitted = LocalBackend(target, batch_size=8)
    assert [g.text for g in fitted.generate(_requests(8), greedy)] == answers
    assert fitted.engine.batch == 2 and all(rows == 2 for rows, _, _ in fitted.engine.graphs)
    assert "decoding 2 rows at a time" in capsys.readouterr().err
