"""`draftsmith train` on the tiny Llama: offline and online give the same loss on the same batch,
the command writes a loadable drafter, metrics and a plot, and packing/splitting behave."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from draftsmith.cli import app
from draftsmith.data.dataset import load_dataset, split_indices
from draftsmith.data.store import StoreReader
from draftsmith.draft.checkpoint import load_drafter
from draftsmith.runtime.head import output_head
from draftsmith.target import load_target
from draftsmith.train.batching import OfflineSource, OnlineSource, collate, pack_rows, shard_rows
from draftsmith.train.config import TrainConfig
from draftsmith.train.loss import TTTObjective
from draftsmith.train.metrics import read_metrics, simulated_tau
from draftsmith.train.run import build_drafter, resolve_vocab
from tests.helpers import write_tokenized_dataset


def _samples(n: int, seed: int = 0) -> list[list[int]]:
    g = np.random.default_rng(seed)
    return [g.integers(3, 400, size=int(g.integers(12, 40))).tolist() for _ in range(n)]


@pytest.fixture(scope="module")
def data_and_store(tmp_path_factory, tiny_target_dir):
    root = tmp_path_factory.mktemp("train")
    ds = write_tokenized_dataset(root / "ds", _samples(10))
    res = CliRunner().invoke(
        app, ["extract", str(ds), "--target", str(tiny_target_dir), "--out", str(root / "store"), "--device", "cpu"]
    )
    assert res.exit_code == 0, res.output
    return root, ds, root / "store"


@pytest.mark.slow
@pytest.mark.parametrize("capture", ["packed", "packed-split", "padded", "packed-flex", "packed-split-compiled"])
def test_offline_and_online_give_the_same_loss(capture, data_and_store, tiny_target_dir, monkeypatch):
    """Online capture, whichever way (a row's samples packed in one forward; packed rows split
    at PACKED_ROW with a padding tail; length-bucketed padded batches; packed with flex attention,
    --capture-attention flex, in a row padded to FLEX_WIDTH; split rows captured one at a time by
    the compiled forward, --compile-capture), gives the loss of the stored states."""
    _, ds_path, store = data_and_store
    target = load_target(str(tiny_target_dir), "cpu", "fp32")
    ds, reader = load_dataset(ds_path), StoreReader(store)
    aux_layer_ids = [int(k) for k in reader.meta["aux_layer_ids"]]
    attention = "flex_attention" if capture == "packed-flex" else None
    online = OnlineSource(
        ds,
        target.model,
        aux_layer_ids,
        max_len=2048,
        token_budget=64,  # several padded sub-batches
        attention=attention,
        compile=capture.endswith("compiled"),
    )
    assert online.packed  # the tiny Llama keeps packed samples apart
    online.packed = capture != "padded"
    if capture.startswith("packed-split"):
        monkeypatch.setattr(OnlineSource, "PACKED_ROW", 40)
    offline = OfflineSource(reader, max_len=2048)
    d2t, t2d = resolve_vocab(
        TrainConfig(dataset_dir=ds_path, out=ds_path, draft_vocab_size=300),
        ds,
        list(range(len(ds))),
        target.info.vocab_size,
    )
    torch.manual_seed(0)
    drafter = build_drafter(target, aux_layer_ids, d2t, t2d, TrainConfig(dataset_dir=ds_path, out=ds_path))
    objective = TTTObjective(drafter, output_head(target.model), ttt=3, backend="eager", chunk=16)
    row = [0, 3, 5, 7]
    a, b = collate(online.samples(row), None), collate(offline.samples(row), None)
    assert torch.equal(a["ids"], b["ids"]) and torch.equal(a["loss_mask"], b["loss_mask"])
    loss_on, st_on = objective(**a)
    loss_off, st_off = objective(**b)
    assert st_on["n_valid"][0] > 10
    assert target.model.config._attn_implementation == "sdpa"  # flex only for the capture's forward
    torch.testing.assert_close(loss_on, loss_off, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(st_on["n_correct"], st_off["n_correct"])
    loss_on.backward()  # the chunked SoftCE loss has a gradient
    assert drafter.fc.weight.grad is not None and drafter.fc.weight.grad.abs().sum() > 0


def test_chunking_does_not_change_the_loss(data_and_store, tiny_target_dir):
    _, ds_path, store = data_and_store
    target = load_target(str(tiny_target_dir), "cpu", "fp32")
    reader = StoreReader(store)
    aux_layer_ids = [int(k) for k in reader.meta["aux_layer_ids"]]
    d2t, t2d = resolve_vocab(
        TrainConfig(dataset_dir=ds_path, out=ds_path, draft_vocab_size=300),
        load_dataset(ds_path),
        [0, 1, 2],
        target.info.vocab_size,
    )
    drafter = build_drafter(target, aux_layer_ids, d2t, t2d, TrainConfig(dataset_dir=ds_path, out=ds_path))
    batch = collate(OfflineSource(reader, 2048).samples([1, 2]), None)
    head = output_head(target.model)
    big, _ = TTTObjective(drafter, head, ttt=2, backend="eager", chunk=4096)(**batch)
    small, _ = TTTObjective(drafter, head, ttt=2, backend="eager", chunk=5)(**batch)
    torch.testing.assert_close(big, small)


@pytest.mark.slow
def test_train_command_online_and_offline(data_and_store, tiny_target_dir):
    root, ds, store = data_and_store
    runner = CliRunner()
    for mode, extra in (("online", []), ("offline", ["--hidden", str(store)])):
        out = root / f"run-{mode}"
        res = runner.invoke(
            app,
            [
                "train",
                str(ds),
                "--target",
                str(tiny_target_dir),
                "--out",
                str(out),
                "--steps",
                "6",
                "--depth",
                "2",
                "--batch-tokens",
                "96",
                "--draft-vocab-size",
                "300",
                "--log-every",
                "2",
                "--val-fraction",
                "0.2",
                "--save-every",
                "3",
                "--lr",
                "1e-3",
                *extra,
            ],
        )
        assert res.exit_code == 0, res.output
        records = read_metrics(out)
        train = [r for r in records if r["split"] == "train"]
        assert [r["step"] for r in train] == [2, 4, 6]
        assert any(r["split"] == "val" for r in records)
        assert all(len(r["acc_k"]) == 2 for r in records)
        assert (out / "metrics.png").stat().st_size > 1000 and (out / "tensorboard").exists()
        model, manifest = load_drafter(out)  # the OUT folder itself is accepted
        assert manifest["meta"]["mode"] == mode and manifest["meta"]["simulated_tau"] >= 1.0
        assert model.config.draft_vocab_size == 300
        assert json.loads((out / "progress.json").read_text())["status"] == "done"
    again = runner.invoke(app, ["train", str(ds), "--target", str(tiny_target_dir), "--out", str(root / "run-online")])
    assert again.exit_code != 0 and "--resume" in again.output


def test_train_records_the_rate_since_the_record_before(data_and_store, tiny_target_dir, monkeypatch):
    """metrics.jsonl's tok_per_s covers the steps since the previous train record, not the run
    since its start: a first interval slowed by compilation does not drag the later ones down."""
    import types

    import draftsmith.train.loop as loop

    clock = iter([1000.0, 1100.0, 1101.0, 1102.0, *range(2000, 2100)])  # the start, then one call per record
    monkeypatch.setattr(
        loop, "time", types.SimpleNamespace(time=lambda: next(clock), perf_counter=loop.time.perf_counter)
    )
    root, ds, store = data_and_store
    out = root / "run-rate"
    args = ["train", str(ds), "--target", str(tiny_target_dir), "--out", str(out), "--hidden", str(store)]
    args += ["--steps", "6", "--depth", "2", "--batch-tokens", "96", "--draft-vocab-size", "300", "--log-every", "2"]
    res = CliRunner().invoke(app, [*args, "--val-fraction", "0.2", "--val-every", "100", "--lr", "1e-3"])
    assert res.exit_code == 0, res.output
    train = [r for r in read_metrics(out) if r["split"] == "train"]
    assert [r["step"] for r in train] == [2, 4, 6]
    assert train[0]["tok_per_s"] == pytest.approx(train[0]["tokens"] / 100)  # the first 100 s: "compilation"
    for before, rec in zip(train, train[1:]):  # then 1 s each
        assert rec["tok_per_s"] == pytest.approx(rec["tokens"] - before["tokens"])


@pytest.mark.slow
def test_train_compile_step_trains_as_the_default_step(data_and_store, tiny_target_dir):
    """`--compile-step` on CPU (the static-shape step, eager; rows padded to --batch-tokens) runs
    and logs the dynamic step's metrics, step by step; the default resolves to the dynamic step
    on CPU (the static one on GPU) and run.yaml records which ran."""
    import yaml

    root, ds, _ = data_and_store
    runs = {}
    for name, extra in (("default", []), ("compile-step", ["--compile-step"])):
        out = root / f"run-{name}"
        res = CliRunner().invoke(
            app,
            [
                "train",
                str(ds),
                "--target",
                str(tiny_target_dir),
                "--out",
                str(out),
                "--steps",
                "3",
                "--depth",
                "2",
                "--batch-tokens",
                "96",
                "--draft-vocab-size",
                "300",
                "--log-every",
                "1",
                "--val-fraction",
                "0.2",
                "--device",
                "cpu",
                *extra,
            ],
        )
        assert res.exit_code == 0, res.output
        assert yaml.safe_load((out / "run.yaml").read_text())["config"]["compile_step"] is (name == "compile-step")
        step = "static, eager" if name == "compile-step" else "dynamic"
        assert (
            f"online, packed capture with the model's own attention; drafter step {step}, TTT attention eager, "
            "autocast off"
        ) in res.output, res.output  # the run's first line: the CPU defaults resolved
        runs[name] = read_metrics(out)
    assert [r["split"] for r in runs["compile-step"]] == [r["split"] for r in runs["default"]]
    for a, b in zip(runs["default"], runs["compile-step"], strict=True):
        for key in ("loss", "tau", "valid_tokens", "acc_k", "cond_acc_k"):
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), (a["split"], a["step"], key)


def test_packing_split_and_sharding():
    lengths = np.array([5, 9, 3, 7, 2, 8, 4, 6])
    rows = pack_rows(lengths, list(range(8)), capacity=12, seed=1)
    assert sorted(i for r in rows for i in r) == list(range(8))
    assert all(sum(lengths[i] for i in r) <= 12 for r in rows)
    assert rows == pack_rows(lengths, list(range(8)), capacity=12, seed=1)
    train, val = split_indices(20, 0.1, seed=0)
    assert len(val) == 2 and not set(train) & set(val) and len(train) + len(val) == 20
    shards = [shard_rows(rows, r, 2) for r in range(2)]
    assert len(shards[0]) == len(shards[1]) == len(rows) // 2
    assert sorted(shards[0] + shards[1]) == sorted(rows[: len(rows) // 2 * 2])  # disjoint, and together every row


def test_simulated_tau():
    assert simulated_tau([1.0, 1.0, 1.0]) == 4.0
    assert simulated_tau([0.5, 0.5]) == pytest.approx(1 + 0.5 + 0.25)


def test_a_failed_resume_writes_nothing(data_and_store, tiny_target_dir):
    """Issue 16 items 8 and 13: a --resume that does not fit the run is refused before run.yaml or
    the vocab is rewritten; --resume with --overwrite, or on a folder with no run, is refused."""
    root, ds, _ = data_and_store
    out = root / "resume-check"
    base = [
        "train",
        str(ds),
        "--target",
        str(tiny_target_dir),
        "--out",
        str(out),
        "--steps",
        "1",
        "--depth",
        "1",
        "--batch-tokens",
        "96",
        "--val-fraction",
        "0",
        "--save-every",
        "1",
    ]
    runner = CliRunner()
    assert runner.invoke(app, [*base, "--draft-vocab-size", "300"]).exit_code == 0
    before = {f: (out / f).read_bytes() for f in ("run.yaml", "vocab.safetensors")}
    res = runner.invoke(app, [*base, "--draft-vocab-size", "200", "--resume"])
    assert res.exit_code == 2 and "was made with other options" in res.output and "run.yaml" in res.output, res.output
    assert {f: (out / f).read_bytes() for f in before} == before
    both = runner.invoke(app, [*base, "--resume", "--overwrite"])
    assert both.exit_code == 2 and "give one of them" in both.output
    missing = runner.invoke(app, [*base[:5], str(root / "no-such-run"), *base[6:], "--resume"])
    assert missing.exit_code == 2 and "holds no training run" in missing.output
    assert not (root / "no-such-run").exists()


@pytest.mark.slow
def test_a_resume_against_other_weights_is_refused(data_and_store, tiny_target_dir, tmp_path):
    """A checkpoint records its target's fingerprint: --resume after a fine-tune of the same shapes
    was saved over the target is refused (the drafter would learn from two teachers), naming the
    checkpoint; with the same weights back, --resume goes on."""
    import shutil

    from transformers import LlamaForCausalLM

    root, ds, _ = data_and_store
    target, out = tmp_path / "target", tmp_path / "run"
    shutil.copytree(tiny_target_dir, target)
    args = ["train", str(ds), "--target", str(target), "--out", str(out), "--steps", "1", "--depth", "1"]
    args += ["--batch-tokens", "96", "--val-fraction", "0", "--save-every", "1"]
    runner = CliRunner()
    assert runner.invoke(app, args).exit_code == 0
    model = LlamaForCausalLM.from_pretrained(target)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.01)
    model.save_pretrained(target)  # a fine-tune saved over the target
    res = runner.invoke(app, [*args, "--resume"])
    assert res.exit_code == 2 and "trained against a target of other weights" in res.output, res.output
    assert "step_00000001" in res.output
    shutil.copy(tiny_target_dir / "model.safetensors", target / "model.safetensors")
    res = runner.invoke(app, [*args, "--resume"])
    assert res.exit_code == 0 and "nothing to train" in res.output, res.output


def test_a_model_that_ignores_packing_is_captured_padded(tiny_target_dir, monkeypatch):
    """If the model's forward lets packed samples attend to each other (here: transformers'
    packed-sequence detection switched off), the check says so and capture falls back."""
    import transformers.masking_utils as masking

    from draftsmith.runtime.capture import packs_sequences

    target = load_target(str(tiny_target_dir), "cpu", "fp32")
    aux_layer_ids = target.info.default_aux_layers
    assert packs_sequences(target.model, aux_layer_ids)
    monkeypatch.setattr(masking, "find_packed_sequence_indices", lambda position_ids: None)
    assert not packs_sequences(target.model, aux_layer_ids)


def test_a_draft_vocab_larger_than_the_targets_is_refused(data_and_store, tiny_target_dir):
    """train and plan take --draft-vocab-size through one rule (`data.vocab.draft_vocab_size`):
    above the target's vocab both refuse it by name, and train leaves no run behind."""
    root, ds, _ = data_and_store
    out = root / "too-wide"
    runner = CliRunner()
    train = runner.invoke(
        app,
        [
            "train",
            str(ds),
            "--target",
            str(tiny_target_dir),
            "--out",
            str(out),
            "--steps",
            "1",
            "--depth",
            "1",
            "--batch-tokens",
            "96",
            "--draft-vocab-size",
            "70000",
        ],
    )
    plan = runner.invoke(
        app, ["plan", str(ds), "--target", str(tiny_target_dir), "--no-calibrate", "--draft-vocab-size", "70000"]
    )
    for res in (train, plan):
        assert res.exit_code == 2 and "--draft-vocab-size 70000 is larger than the target's vocab" in res.output, (
            res.output
        )
    assert not out.exists() or [p.name for p in out.iterdir()] == []
