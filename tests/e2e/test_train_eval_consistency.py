"""Training and evaluation agree: a drafter trained on the target's own greedy answers to a few
prompts reaches, when `draftsmith eval` decodes those prompts again, a measured τ close to the
simulated τ (and the walked τ) that training reported. This ties the two alignments together (training's TTT
positions and targets, and eval's drafter KV cache, positions and verification): a shift of one
position in either would leave the simulated τ high and the measured τ near 1."""

from __future__ import annotations

import json

import pytest
import torch

from draftsmith.config import resolve_config
from draftsmith.draft.checkpoint import load_drafter
from draftsmith.evaluate.config import EvalConfig
from draftsmith.evaluate.run import run as evaluate
from draftsmith.target import shared_targets
from draftsmith.train.config import TrainConfig
from draftsmith.train.run import run as train
from tests.helpers import write_dataset_and_store

pytestmark = pytest.mark.slow

PROMPTS = [
    "What is the capital of France?",
    "Name a primary colour.",
    "How many legs does a spider have?",
    "What do bees make?",
    "Which planet is the largest?",
    "Say hello in Spanish.",
]
NEW_TOKENS = 24


def greedy_answer(target, prompt: str) -> str:
    tok = target.tokenizer
    text = tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True)
    ids = tok(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        out = target.model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS, do_sample=False
        )
    return tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True)


def test_measured_tau_matches_simulated_tau(tmp_path, smollm2):
    convs = [
        [{"role": "user", "content": p}, {"role": "assistant", "content": greedy_answer(smollm2, p)}] for p in PROMPTS
    ]
    ds, store = write_dataset_and_store(tmp_path, smollm2, convs)
    cfg = resolve_config(
        TrainConfig,
        None,
        {
            "dataset_dir": ds,
            "hidden": store,
            "target": smollm2.info.name,
            "out": tmp_path / "run",
            "device": "cpu",
            "steps": 30,
            "depth": 2,
            "lr": 1e-2,
            "warmup_ratio": 0,
            "val_fraction": 0,
            "val_every": 1000,
            "draft_vocab_size": 512,
            "log_every": 10,
            "save_every": 1000,
        },
    )
    with shared_targets(smollm2):  # the session target, not a second copy
        train(cfg)
    val = load_drafter(tmp_path / "run")[1]["meta"]["val"]
    simulated, walked = val["tau"], val["tau_walk"]

    bench = tmp_path / "prompts.jsonl"
    bench.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))

    def measure(batch: int) -> tuple[float, list[dict]]:
        out = evaluate(
            EvalConfig(
                drafter=tmp_path / "run",
                out=tmp_path / f"eval-b{batch}",
                bench=str(bench),
                mode="chain",
                k=2,
                num_questions=len(PROMPTS),
                max_new_tokens=NEW_TOKENS,
                speed=False,
                device="cpu",
                batch_size=batch,
            )
        )
        answers = [json.loads(line) for line in (out / "answers.jsonl").read_text().splitlines()]
        return json.loads((out / "report.json").read_text())["tau"], answers

    measured, one = measure(1)
    assert simulated > 2.2, simulated
    assert abs(measured - simulated) < 0.4, (measured, simulated)
    assert abs(measured - walked) < 0.4, (measured, walked)  # 2026-12-01: simulated 2.97, walked 2.92, measured 2.98
    # in batches of 4 (the prompts left-padded to each batch's longest), fp32: the same tokens, and the
    # drafter accepted step for step as at batch 1 (its padded prefill and KV slots see what batch 1 sees)
    tau4, four = measure(4)
    assert [a["token_ids"] for a in four] == [a["token_ids"] for a in one]
    assert [a["accepts"] for a in four] == [a["accepts"] for a in one] and tau4 == measured
