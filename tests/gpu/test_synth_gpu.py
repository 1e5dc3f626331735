"""GPU checks of synth's batched static-KV generator (run with --run-gpu on a CUDA machine): the
CUDA-graphed batched decoding gives HF `generate`'s greedy answers on the embedded default in
fp32 (batches of 8 and 4 + 4 dummy rows), also where the batch shrinks to its running rows with
graphs captured mid-generation and with each graph compiled layer by layer, and seeded sampling
repeats."""

from __future__ import annotations

import json

import pytest
import torch

from draftsmith.assets import GSM8K_TRAIN
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


@pytest.mark.parametrize(("shrink", "compile"), [(False, False), (True, False), (False, True)])
def test_graphed_batched_greedy_equals_generate(target, monkeypatch, shrink, compile):
    """shrink (synth --shrink-batches): the batch goes down to its running rows (MIN_ROWS 1, a look
    every 4 steps), each smaller graph captured when first needed, in the middle of the batch's
    generation. compile (synth --compile-target): each graph's forward compiled layer by layer."""
    import draftsmith.synth.generate as gen_mod

    if shrink:
        monkeypatch.setattr(gen_mod, "MIN_ROWS", 1)
        monkeypatch.setattr(gen_mod, "CHECK_EVERY", 4)
    tok, model = target.tokenizer, target.model
    backend = LocalBackend(target, batch_size=8, shrink=shrink, compile=compile)
    assert backend.use_engine  # auto picks the engine on CUDA
    requests = _requests(12)
    gens = backend.generate(requests, Sampling(0.0, 1.0, 0, 64, 0))
    assert backend.engine is not None and backend.engine.graphs  # decoded in CUDA graphs
    assert shrink == any(rows < 8 for rows, _, _ in backend.engine.graphs)
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
