"""The DeepSeek-V3 family (Kimi-K2's architecture: MLA attention, routed experts) through the
real CLI on tiny random models built in-process.

- As the real checkpoints are (as many key-value heads as heads): prepare -> extract -> train
  offline -> train online -> eval, end to end.
- With fewer key-value heads than heads (4 and 2), as a small config written by hand easily
  is: transformers' DeepSeek-V3 expands the MLA keys to every head, and its sdpa path then
  repeats them by heads // kv heads under any attention mask, so a packed or a padded forward
  raises ("size of tensor a (4) must match the size of tensor b (8)"). Extract and online
  training notice and capture one sample per forward, saying so in one line; the stored and the
  online-captured states equal the model's own `output_hidden_states`. (eval's verification
  forward runs under a mask too and fails on such a model: not covered here.)
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from draftsmith.data.dataset import load_dataset
from draftsmith.data.store import StoreReader
from draftsmith.runtime.capture import packs_sequences, pads_sequences
from draftsmith.train.batching import OnlineSource
from draftsmith.train.metrics import read_metrics
from tests.helpers import cli_ok, tiny_causal_lm

pytestmark = pytest.mark.slow

LAYERS = [1, 2, 3]
CONVS = [
    [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
    for q, a in [
        ("Name a prime number.", "Seven is a prime number."),
        ("Say hi.", "Hi there, how are you today?"),
        ("What do bees make?", "Bees make honey and wax."),
        ("Largest planet?", "Jupiter is the largest planet."),
        ("Colour of the sky?", "The sky is blue on a clear day."),
        ("Two plus two?", "Two plus two is four."),
    ]
]
CPU = ["--device", "cpu", "--dtype", "fp32"]
TRAIN = ["--steps", 3, "--depth", 2, "--batch-tokens", 128, "--log-every", 1, "--val-fraction", 0.34, *CPU]


def prepared(tmp_path, tokenizer, **overrides):
    """The tiny DeepSeek-V3 (`overrides` to its config) saved with the tokenizer, and CONVS prepared for it."""
    model = tiny_causal_lm("deepseek_v3", len(tokenizer), num_hidden_layers=4, **overrides)
    model.save_pretrained(tmp_path / "target")
    tokenizer.save_pretrained(tmp_path / "target")
    data = tmp_path / "convs.jsonl"
    data.write_text("".join(json.dumps({"messages": c}) + "\n" for c in CONVS))
    cli_ok("prepare", data, "--target", tmp_path / "target", "--out", tmp_path / "ds")
    return model, tmp_path / "target"


def assert_trained(run) -> None:
    losses = [r["loss"] for r in read_metrics(run) if r["split"] == "train"]
    assert len(losses) == 3 and all(math.isfinite(x) for x in losses), (run, losses)


def test_deepseek_v3_end_to_end(tmp_path, tokenizer):
    model, target = prepared(tmp_path, tokenizer)
    assert packs_sequences(model, LAYERS)
    cli_ok(
        "extract", tmp_path / "ds", "--target", target, "--out", tmp_path / "store", "--aux-layer-ids", "1,2,3", *CPU
    )
    cli_ok(
        "train",
        tmp_path / "ds",
        "--target",
        target,
        "--hidden",
        tmp_path / "store",
        "--out",
        tmp_path / "offline",
        *TRAIN,
    )
    out = cli_ok(
        "train", tmp_path / "ds", "--target", target, "--out", tmp_path / "online", "--aux-layer-ids", "1,2,3", *TRAIN
    )
    assert "online, packed capture" in out
    assert_trained(tmp_path / "offline")
    assert_trained(tmp_path / "online")
    for run in ("offline", "online"):
        cli_ok(
            "eval",
            "--target",
            target,
            "--drafter",
            tmp_path / run,
            "--out",
            tmp_path / f"eval-{run}",
            "--bench",
            "held-out",
            "--depth",
            2,
            "--num-questions",
            2,
            "--max-new-tokens",
            8,
            "--no-speed",
            *CPU,
        )
        report = json.loads((tmp_path / f"eval-{run}/report.json").read_text())
        assert report["tau"] >= 1.0 and len(report["accept_per_position"]) == 2


def test_deepseek_v3_without_packing_captures_one_sample_per_forward(tmp_path, tokenizer):
    model, target = prepared(tmp_path, tokenizer, num_key_value_heads=2)
    assert not packs_sequences(model, LAYERS) and not pads_sequences(model, LAYERS)
    out = cli_ok(
        "extract", tmp_path / "ds", "--target", target, "--out", tmp_path / "store", "--aux-layer-ids", "1,2,3", *CPU
    )
    assert "one sample per forward instead" in out
    out = cli_ok(
        "train", tmp_path / "ds", "--target", target, "--out", tmp_path / "online", "--aux-layer-ids", "1,2,3", *TRAIN
    )
    assert out.count("does not keep packed samples apart") == 1
    assert "captured one sample per forward (its padded batches fail as well) instead" in out
    assert_trained(tmp_path / "online")

    reader, ds = StoreReader(tmp_path / "store"), load_dataset(tmp_path / "ds")
    online = OnlineSource(ds, model, LAYERS, max_len=2048, token_budget=4096).samples(list(range(len(ds))))
    H = model.config.hidden_size
    for i in range(len(reader)):
        stored = reader[i]
        ids = stored["input_ids"].long()
        with torch.no_grad():
            ref = model(ids[None], output_hidden_states=True).hidden_states  # L+1, the last after the final norm
        j = int(reader.sample_ids[i])
        assert torch.equal(online[j]["input_ids"].long(), ids)
        for aux, final in (
            (stored["aux_hidden_states"], stored["final_hidden_states"]),
            (online[j]["aux"], online[j]["final"]),
        ):
            for n, k in enumerate(LAYERS):
                torch.testing.assert_close(aux[:, n * H : (n + 1) * H], ref[k][0])
            torch.testing.assert_close(final, ref[-1][0])
