"""Overfit 8 conversations on the embedded default (SmolLM2-135M) on CPU with `draftsmith train`
in offline mode: acc_0 must pass 0.9 and the simulated τ must rise steadily.

The conversations are tokenized with the real chat template and assistant masks
(`data.chat`), and their hidden states are written once by `draftsmith extract` into a store,
with the already loaded session target serving every step (loading the GGUF again would cost
more than the training)."""

from __future__ import annotations

import pytest

from draftsmith.config import resolve_config
from draftsmith.data.dataset import load_dataset
from draftsmith.draft.checkpoint import load_drafter
from draftsmith.target import shared_targets
from draftsmith.train.config import TrainConfig
from draftsmith.train.metrics import read_metrics
from draftsmith.train.run import run
from tests.helpers import write_dataset_and_store

pytestmark = pytest.mark.slow

PAIRS = [
    ("What is the capital of France?", "The capital of France is Paris, a city on the Seine."),
    ("Name a primary colour.", "Red is a primary colour, together with blue and yellow."),
    ("How many legs does a spider have?", "A spider has eight legs."),
    ("What do bees make?", "Bees make honey and beeswax in their hives."),
    ("What is 2 plus 2?", "Two plus two equals four."),
    ("Which planet is the largest?", "Jupiter is the largest planet in the solar system."),
    ("What is water made of?", "Water is made of hydrogen and oxygen: H2O."),
    ("Say hello in Spanish.", "Hello in Spanish is hola."),
]


def test_overfit_eight_conversations(tmp_path, smollm2):
    convs = [
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": p},
            {"role": "assistant", "content": r},
        ]
        for p, r in PAIRS
    ]  # a short system prompt: fewer untrained tokens
    ds, store = write_dataset_and_store(tmp_path, smollm2, convs)
    assert int(load_dataset(ds).mask.sum()) > 80  # real assistant masks
    out = tmp_path / "run"
    cfg = resolve_config(
        TrainConfig,
        None,
        {
            "dataset_dir": ds,
            "hidden": store,
            "target": smollm2.info.name,
            "out": out,
            "device": "cpu",
            "steps": 30,
            "depth": 2,
            "lr": 1e-2,
            "warmup_ratio": 0,
            "val_fraction": 0,
            "val_every": 1000,
            "draft_vocab_size": 512,
            "log_every": 2,
            "save_every": 1000,
        },
    )
    with shared_targets(smollm2):  # the session target, not a second copy
        run(cfg)
    train = [r for r in read_metrics(out) if r["split"] == "train"]
    acc0 = [r["acc_0"] for r in train]
    tau = [r["tau"] for r in train]
    assert acc0[-1] > 0.9, acc0
    # steadily: a clear overall rise, and never a big drop between logs
    assert tau[-1] > tau[0] + 0.5, tau
    assert all(b > a - 0.3 for a, b in zip(tau, tau[1:])), tau
    _, manifest = load_drafter(out)
    assert manifest["meta"]["simulated_tau"] > 1.5
