"""Local backend on the tiny in-process Llama, with both generators (HF `generate` and the
static-KV engine): batched greedy equals per-prompt `generate`, stop tokens from the template,
prompts too long for the context, static-cache padding, seeded sampling."""

from __future__ import annotations

import pytest
import torch

from draftsmith.runtime.sampling import Sampling
from draftsmith.synth.local import LocalBackend, stop_token_ids
from draftsmith.synth.magpie import end_of_turn, user_turn_prefix
from draftsmith.synth.turns import Request

GREEDY = Sampling(0.0, 1.0, 0, 8, 0)
QUESTIONS = ["hi", "What is two plus two? Please explain in detail.", "x", "Tell me a story about owls and the moon."]


def _chat(q):
    return Request(f"{q}/a0", messages=[{"role": "user", "content": q}])


def _reference(target, request, max_new_tokens):
    tok = target.tokenizer
    ids = tok(
        tok.apply_chat_template(request.messages, tokenize=False, add_generation_prompt=True),
        add_special_tokens=False,
        return_tensors="pt",
    )["input_ids"]
    with torch.inference_mode():
        out = target.model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=sorted(stop_token_ids(target)),
            pad_token_id=tok.pad_token_id,
        )
    return out[0, ids.shape[1] :].tolist()


def test_template_markers(tokenizer):
    assert end_of_turn(tokenizer, "user") == end_of_turn(tokenizer, "assistant") == "<|im_end|>"
    prefix = user_turn_prefix(tokenizer, [{"role": "system", "content": "Be brief."}])
    assert prefix == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n"
    assert user_turn_prefix(tokenizer, []).startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")


GENERATORS = pytest.mark.parametrize("generator", ["hf", "engine"])


@pytest.mark.slow
@GENERATORS
def test_batched_greedy_equals_single_generate(tiny_target, generator):
    backend = LocalBackend(
        tiny_target, batch_size=3, generator=generator
    )  # length-sorted batches of 3 and 1, left-padded
    assert backend.stop == {tiny_target.tokenizer.convert_tokens_to_ids("<|im_end|>")}
    requests = [_chat(q) for q in QUESTIONS]
    gens = backend.generate(requests, GREEDY)
    for req, gen in zip(requests, gens):
        ref = _reference(tiny_target, req, 8)
        assert gen.text == tiny_target.tokenizer.decode(ref, skip_special_tokens=True)
        assert gen.tokens == len(ref) and not gen.too_long


@pytest.mark.slow
def test_refilled_rows_answer_as_single_generate(tiny_target):
    """synth --refill-batches: the four questions through two rows, a row taking the next question
    once its answer ends; each answer is `generate`'s on its question alone. Refused with the HF
    generator and beside --shrink-batches."""
    from draftsmith.errors import UserError

    backend = LocalBackend(tiny_target, batch_size=2, generator="engine", refill=True)
    requests = [_chat(q) for q in QUESTIONS]
    for req, gen in zip(requests, backend.generate(requests, GREEDY)):
        ref = _reference(tiny_target, req, 8)
        assert gen.text == tiny_target.tokenizer.decode(ref, skip_special_tokens=True) and gen.tokens == len(ref)
    assert backend.engine.batch == 2 and backend.decoding.endswith("rows refilled")
    with pytest.raises(UserError, match="--refill-batches: it needs the local engine"):
        LocalBackend(tiny_target, generator="hf", refill=True)
    with pytest.raises(UserError, match="drop --shrink-batches"):
        LocalBackend(tiny_target, generator="engine", refill=True, shrink=True)


@pytest.mark.slow
def test_static_cache_matches_dynamic(tiny_target):
    requests = [_chat(q) for q in QUESTIONS[:2]]
    dynamic = LocalBackend(tiny_target, batch_size=2, generator="hf").generate(requests, GREEDY)
    static = LocalBackend(tiny_target, batch_size=2, cache="static", generator="hf").generate(requests, GREEDY)
    assert [g.text for g in static] == [g.text for g in dynamic]


@pytest.mark.slow
def test_too_long_prompt_is_skipped(tiny_target):
    backend = LocalBackend(tiny_target, batch_size=4)
    assert backend.context == 512
    long_q = "word " * 600
    gens = backend.generate([_chat("short"), _chat(long_q)], GREEDY)
    assert not gens[0].too_long and gens[0].tokens > 0
    assert gens[1].too_long and gens[1].tokens == 0 and gens[1].text == ""


@pytest.mark.slow
@GENERATORS
def test_stop_at_end_of_turn_marks_finished(tiny_target, generator):
    backend = LocalBackend(tiny_target, batch_size=2, generator=generator)
    # make the stop set include whatever the model emits first, so that it must stop right there
    first = _reference(tiny_target, _chat("hi"), 1)[0]
    backend.stop = backend.stop | {first}
    (gen,) = backend.generate([_chat("hi")], GREEDY)
    assert gen.finished and gen.tokens == 1 and gen.text == ""


@pytest.mark.slow
@GENERATORS
def test_sampling_is_seeded(tiny_target, generator):
    backend = LocalBackend(tiny_target, batch_size=2, generator=generator)
    hot = Sampling(1.0, 1.0, 0, 8, 5)
    a = backend.generate([_chat("hi"), _chat("x")], hot)
    b = backend.generate([_chat("hi"), _chat("x")], hot)
    c = backend.generate([_chat("hi"), _chat("x")], Sampling(1.0, 1.0, 0, 8, 6))
    assert [g.text for g in a] == [g.text for g in b] != [g.text for g in c]


def test_magpie_max_tokens_caps_the_user_turns_alone(tiny_target_dir, tmp_path, monkeypatch):
    """synth --magpie-max-tokens: a self-prompted user turn is generated under its own cap, the
    answer under --max-new-tokens; the cap joins the generation settings (a resume under another
    cap is other work), which stay as they were without it."""
    import json

    from typer.testing import CliRunner

    from draftsmith.cli import app
    from draftsmith.synth.turns import Generation

    caps = []

    def generate(self, requests, sampling):  # the caps asked for, and a plausible turn each
        caps.append(("user" if requests[0].prefix is not None else "answer", sampling.max_new_tokens))
        return [Generation(f"Question {r.key}?" if r.prefix is not None else "Yes.", 2, True) for r in requests]

    monkeypatch.setattr(LocalBackend, "generate", generate)

    def run(name: str, *cap: str) -> list[dict]:
        caps.clear()
        out = tmp_path / name / "conversations.jsonl"
        args = ["synth", "--target", str(tiny_target_dir), "--magpie", "3", "--max-new-tokens", "8", "--out", str(out)]
        res = CliRunner().invoke(app, [*args, "--batch-size", "3", *cap])
        assert res.exit_code == 0, res.output
        return [json.loads(line) for line in out.read_text().splitlines()]

    capped = run("capped", "--magpie-max-tokens", "3")
    assert caps == [("user", 3), ("answer", 8)] and len(capped) == 3
    uncapped = run("uncapped")
    assert caps == [("user", 8), ("answer", 8)] and len(uncapped) == 3
    assert (
        capped[0]["generation"]["magpie"]["max_tokens"] == 3 and "max_tokens" not in uncapped[0]["generation"]["magpie"]
    )


def test_synth_says_how_it_decodes(tiny_target, tiny_target_dir, tmp_path):
    """What the defaults picked, in synth's log and progress.json: the engine and its levers on CPU
    (no graphs, no flash decoding, batches kept whole), or HF generate and its cache."""
    import json

    from typer.testing import CliRunner

    from draftsmith.cli import app

    assert LocalBackend(tiny_target, generator="engine").decoding == (
        "draftsmith's engine, masked attention, batches kept whole"
    )
    assert LocalBackend(tiny_target, generator="engine", shrink=True).decoding.endswith("batches shrinking")
    assert LocalBackend(tiny_target, generator="hf", cache="static").decoding == "HF generate (static cache)"
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"Say {w}."}) + "\n" for w in ("yes", "no")))
    out = tmp_path / "synth" / "conversations.jsonl"
    args = ["synth", str(prompts), "--target", str(tiny_target_dir), "--out", str(out)]
    options = ["--max-new-tokens", "4", "--keep-unfinished", "--temperature", "1", "--generator", "engine"]
    res = CliRunner().invoke(app, [*args, *options])  # sampled: the tiny model answers nothing at greedy
    assert res.exit_code == 0, res.output
    assert "draftsmith's engine, masked attention, batches kept whole" in res.stderr
    progress = json.loads((out.parent / "conversations.synth" / "progress.json").read_text())
    assert progress["counters"]["decoding"] == "draftsmith's engine, masked attention, batches kept whole"


def test_a_grown_engine_lets_the_old_one_go(tiny_target):
    """A batch that needs more cache slots rebuilds the engine; the old one (its cache, and on a GPU
    its graphs' memory pools) is freed before the new one is allocated, though an engine refers to
    itself (its layer step is one of its own bound methods): on an H100 the pipeline's two-turn
    Magpie set ran out of memory with every earlier engine of the stage still held."""
    import gc
    import weakref

    backend = LocalBackend(tiny_target, batch_size=2, generator="engine")
    backend._reserve(2, 64)
    old = weakref.ref(backend.engine)
    gc.disable()  # no collection but the one the rebuild makes
    try:
        backend._reserve(2, 128)
        assert old() is None
    finally:
        gc.enable()
    assert backend.engine is not None and backend.engine.max_len >= 128


def test_the_engine_cache_takes_what_kv_bytes_per_token_says(tiny_target):
    """synth fits its rows by kv_bytes_per_token (as eval checks its memory): the engine's cache."""
    from draftsmith.runtime.engine import TargetEngine
    from draftsmith.target import text_config
    from draftsmith.vllm_support import kv_bytes_per_token

    engine = TargetEngine(tiny_target.model, [], 48, batch=3)
    per_token = kv_bytes_per_token(text_config(tiny_target.model.config), tiny_target.dtype.itemsize)
    assert engine.kv.numel() * engine.kv.element_size() == per_token * 3 * 48


@pytest.mark.slow
def test_rows_fit_the_free_memory(tiny_target, monkeypatch, capsys):
    """A batch whose cache would take more than CACHE_SHARE of the device's free memory decodes as
    many rows as fit at a time, says so, and answers as the whole batch would; a later call
    that fits no more rows keeps the engine. Where not one row fits, synth says what to do."""
    import draftsmith.synth.local as local_mod
    from draftsmith.errors import UserError
    from draftsmith.target import text_config
    from draftsmith.vllm_support import kv_bytes_per_token

    requests = [_chat(q) for q in QUESTIONS]
    unfitted = LocalBackend(tiny_target, batch_size=4, generator="engine")
    whole = unfitted.generate(requests, GREEDY)
    assert unfitted.engine.batch == 4 and not unfitted.rows_fitted
    slots = unfitted.engine.max_len  # the slots this batch needs
    row = kv_bytes_per_token(text_config(tiny_target.model.config), tiny_target.dtype.itemsize) * slots
    room = row * 2.5 / local_mod.CACHE_SHARE  # 2 rows and a half
    monkeypatch.setattr(local_mod, "available_memory", lambda device: int(room))
    backend = LocalBackend(tiny_target, batch_size=4, generator="engine")
    fitted = backend.generate(requests, GREEDY)
    assert backend.engine.batch == 2 and backend.rows_fitted
    assert backend.decoding.endswith("2 of 4 rows at a time (what the memory fits)")  # progress.json's `decoding`
    assert [g.text for g in fitted] == [g.text for g in whole]
    err = capsys.readouterr().err
    assert f"4 rows of {slots} cache slots" in err and "decoding 2 rows at a time" in err
    engine = backend.engine
    backend.generate(requests[:1], GREEDY)
    assert backend.engine is engine  # no rebuild for a batch the fitted engine already serves

    monkeypatch.setattr(local_mod, "available_memory", lambda device: 1000)
    with pytest.raises(UserError, match="lower --max-new-tokens, or free the device's memory"):
        LocalBackend(tiny_target, batch_size=4, generator="engine").generate(requests, GREEDY)
