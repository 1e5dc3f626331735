"""Overfit 8 conversations on the embedded default (SmolLM2-135M) on CPU with `draftsmith train`
in offline mode: acc_0 must pass 0.9 and the simulated τ must rise steadily.

The conversations are tokenized with the real chat template and assistant masks
(`data.chat`), and their hidden states are captured once with `extract.capture` into a store
in the documented format, so the already loaded session target serves every step (loading the
GGUF again would cost more than the training)."""

from __future__ import annotations

import json

import torch
from safetensors.torch import save_file

from draftsmith.config import resolve_config
from draftsmith.data.chat import tokenize_conversations
from draftsmith.data.dataset import FORMAT, META_FILE, load_dataset, write_table
from draftsmith.data.store import MANIFEST, STORE_FILE, crc32, new_store_meta, sample_relpath
from draftsmith.draft.checkpoint import load_drafter
from draftsmith.runtime.capture import capture
from draftsmith.target import shared_targets
from draftsmith.train.config import TrainConfig
from draftsmith.train.metrics import read_metrics
from draftsmith.train.run import run

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


def write_dataset_and_store(tmp_path, target, convs=None):
    """A prepared dataset and a hidden-state store of `convs` (default: PAIRS)."""
    convs = convs or [[{"role": "system", "content": "Be brief."}, {"role": "user", "content": p},
                       {"role": "assistant", "content": r}] for p, r in PAIRS]  # a short system prompt: fewer untrained tokens
    samples = tokenize_conversations(target.tokenizer, convs)
    ds = tmp_path / "ds"
    ds.mkdir()
    write_table(ds, {"sample_id": list(range(len(samples))), "input_ids": [s[0].tolist() for s in samples],
                     "loss_mask": [s[1].tolist() for s in samples], "length": [len(s[0]) for s in samples]})
    (ds / META_FILE).write_text(json.dumps({"format": FORMAT, "version": 1, "target": {}, "max_len": 2048}))
    store, layers = tmp_path / "store", target.info.default_aux_layers
    manifest = []
    for i, (ids, mask) in enumerate(samples):
        aux, final = capture(target.model, torch.as_tensor(ids, dtype=torch.long)[None], None, layers)
        rel = sample_relpath(i)
        (store / rel).parent.mkdir(parents=True, exist_ok=True)
        save_file({"input_ids": torch.as_tensor(ids, dtype=torch.int32), "loss_mask": torch.as_tensor(mask, dtype=torch.uint8),
                   "aux_hidden_states": aux[0].contiguous(), "final_hidden_states": final[0].contiguous()}, str(store / rel))
        data = (store / rel).read_bytes()
        manifest.append({"sample_id": i, "path": rel, "tokens": len(ids), "bytes": len(data), "crc32": crc32(data)})
    (store / MANIFEST).write_text("".join(json.dumps(m) + "\n" for m in manifest))
    (store / STORE_FILE).write_text(json.dumps(new_store_meta(target.info.to_dict(), layers, "float32", {})))
    return ds, store


def test_overfit_eight_conversations(tmp_path, smollm2):
    ds, store = write_dataset_and_store(tmp_path, smollm2)
    assert int(load_dataset(ds).mask.sum()) > 80  # real assistant masks
    out = tmp_path / "run"
    cfg = resolve_config(TrainConfig, None, {
        "dataset_dir": ds, "hidden": store, "target": smollm2.info.name, "out": out, "device": "cpu", "steps": 30, "ttt": 2, "lr": 1e-2,
        "warmup_ratio": 0, "val_fraction": 0, "val_every": 1000, "draft_vocab_size": 512, "log_every": 2,
        "save_every": 1000})
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
