"""The parallel methods trained as their papers train them: `train --paper-settings` fills every
option not given with the method's reference values (P-EAGLE: four layers, the embedding
trained, AdamW; DFlash: every answer position anchored each pass, five layers fed from five
target layers, AdamW at 6e-4), `--anchors` places DFlash's blocks, `--train-embedding` trains the
drafter's embedding (checkpointed, resumed and exported with it), and a DFlash drafter reads any
number of target layers while EAGLE-3 reads three."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from pydantic import ValidationError
from safetensors import safe_open
from typer.testing import CliRunner

from draftsmith.cli import app
from draftsmith.draft.checkpoint import load_drafter
from draftsmith.errors import UserError
from draftsmith.layers import validate_layers
from draftsmith.train.config import TrainConfig, paper_aux_layers
from tests.helpers import make_tiny_llama, write_tokenized_dataset

BASE = {"dataset_dir": "ds", "out": "out", "target": "t"}


def config(**options) -> TrainConfig:
    return TrainConfig(**BASE, **options)


def test_paper_settings_fill_the_options_not_given():
    d = config(method="dflash", paper_settings=True)
    assert (d.anchors, d.num_layers, d.optimizer, d.lr, d.warmup_ratio, d.grad_clip) == (
        "all",
        5,
        "adamw",
        6e-4,
        0.04,
        1.0,
    )
    p = config(method="peagle", paper_settings=True)
    assert (p.num_layers, p.train_embedding, p.optimizer, p.lr) == (4, True, "adamw", 1e-4)
    given = config(method="dflash", paper_settings=True, lr=1e-3, anchors=64, num_layers=2)
    assert (given.lr, given.anchors, given.num_layers, given.optimizer) == (1e-3, 64, 2, "adamw")
    plain = config(method="dflash")
    assert (plain.anchors, plain.num_layers, plain.optimizer, plain.lr) == (None, 1, "muon", 2e-3)


@pytest.mark.parametrize(
    "options, says",
    [
        ({"paper_settings": True}, "EAGLE-3's defaults are draftsmith's own measured recipe"),
        ({"anchors": 64}, "--anchors places DFlash's blocks"),
        ({"method": "peagle", "anchors": "all"}, "--method peagle trains every position"),
        ({"method": "dflash", "anchors": 0}, "give a number of anchors"),
        ({"method": "dflash", "anchors": "most"}, "give a number of anchors"),
    ],
)
def test_what_the_settings_refuse(options, says):
    with pytest.raises(ValidationError, match=says):
        config(**options)


def test_dflash_reference_spread_of_target_layers_in_draftsmith_ids():
    # DFlash's build_target_layer_ids(30, 5) = [1, 8, 14, 20, 27] (layer outputs): the streams entering 2, 9, ...
    assert paper_aux_layers(30, 5) == [2, 9, 15, 21, 28]
    assert paper_aux_layers(30, 1) == [16]
    assert validate_layers(paper_aux_layers(30, 5), 30, count=None) == [2, 9, 15, 21, 28]


def test_eagle3_reads_three_target_layers_and_dflash_any_number():
    with pytest.raises(UserError, match="EAGLE-3 takes exactly 3"):
        validate_layers([2, 9, 15, 21, 28], 30)
    assert validate_layers([2, 9, 15, 21, 28], 30, count=None) == [2, 9, 15, 21, 28]
    with pytest.raises(UserError, match="no layer ids"):
        validate_layers([], 30, count=None)


@pytest.fixture(scope="module")
def eight_layers(tmp_path_factory, tokenizer):
    """A tiny Llama of eight layers (enough for five distinct target layers) and a dataset."""
    root = tmp_path_factory.mktemp("paper")
    make_tiny_llama(len(tokenizer), num_layers=8).save_pretrained(root / "target")
    tokenizer.save_pretrained(root / "target")
    g = np.random.default_rng(0)
    samples = [g.integers(3, 400, size=int(g.integers(16, 40))).tolist() for _ in range(10)]
    return root / "target", write_tokenized_dataset(root / "ds", samples), root


def train(setup, out: str, *extra: str):
    target, ds, root = setup
    args = [
        "train", str(ds), "--target", str(target), "--out", str(root / out), "--steps", "4", "--depth", "3",
        "--batch-tokens", "96", "--draft-vocab-size", "300", "--log-every", "2", "--val-fraction", "0.2",
        "--save-every", "2", "--device", "cpu", *extra,
    ]  # fmt: skip
    return CliRunner().invoke(app, args), args


def test_dflash_paper_settings_train_five_layers_on_five_target_layers_and_export(eight_layers):
    res, _ = train(eight_layers, "dflash", "--method", "dflash", "--paper-settings")
    assert res.exit_code == 0, res.output
    model, record = load_drafter(eight_layers[2] / "dflash")
    assert model.config.num_layers == 5 and model.config.aux_layer_ids == paper_aux_layers(8, 5) == [2, 3, 4, 5, 6]
    assert model.fc.in_features == 5 * 64
    out = eight_layers[2] / "dflash_export"
    res = CliRunner().invoke(app, ["export", str(eight_layers[2] / "dflash"), "--out", str(out)])
    assert res.exit_code == 0, res.output
    layers = json.loads((out / "config.json").read_text())["dflash_config"]["target_layer_ids"]
    assert layers == [1, 2, 3, 4, 5]  # DFlash's own convention: layer outputs
    bench = eight_layers[2] / "q.jsonl"
    bench.write_text(json.dumps({"turns": ["Say hi."]}) + "\n")
    res = CliRunner().invoke(
        app,
        [
            "eval", "--target", str(eight_layers[0]), "--drafter", str(eight_layers[2] / "dflash"), "--bench",
            str(bench), "--depth", "3", "--max-new-tokens", "12", "--out", str(eight_layers[2] / "dflash_eval"),
        ],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    report = json.loads((eight_layers[2] / "dflash_eval" / "report.json").read_text())
    assert report["greedy_turns_matching_plain"] == report["turns"] == 1  # five target layers, lossless


def test_dflash_anchors_all_trains_on_every_answer_position(eight_layers):
    """Every anchor each pass: the positions a training step is scored on (`valid_tokens`, the
    first slot's) are more than a sample of 4 anchors a row gives."""
    from draftsmith.train.metrics import read_metrics

    counts = {}
    for anchors in ("all", "4"):
        res, _ = train(
            eight_layers, f"anchors_{anchors}", "--method", "dflash", "--anchors", anchors, "--val-fraction", "0"
        )
        assert res.exit_code == 0, res.output
        records = read_metrics(eight_layers[2] / f"anchors_{anchors}")
        counts[anchors] = [r for r in records if r["split"] == "train"][-1]
    # a log line sums two steps of one 96-token row each: at most 4 anchors each with --anchors 4
    assert counts["4"]["valid_tokens"] <= 2 * 4 < counts["all"]["valid_tokens"]


def test_train_embedding_trains_checkpoints_resumes_and_exports_it(eight_layers):
    target, _, root = eight_layers
    res, args = train(eight_layers, "emb", "--train-embedding")
    assert res.exit_code == 0, res.output
    model, record = load_drafter(root / "emb")
    assert record["meta"]["trained_embedding"] is True
    from transformers import AutoModelForCausalLM

    embed = AutoModelForCausalLM.from_pretrained(target).get_input_embeddings().weight
    assert not torch.allclose(model.embed_tokens.weight, embed.float())  # it moved off the target's
    ckpts = sorted((root / "emb" / "checkpoints").glob("step_*"))
    with safe_open(ckpts[-1] / "model.safetensors", "pt") as f:
        assert "embed_tokens.weight" in f.keys()
    res = CliRunner().invoke(app, [*args, "--resume"])
    assert res.exit_code == 0 and "finished at step 4 already" in res.output, res.output
    out = root / "emb_export"
    res = CliRunner().invoke(app, ["export", str(root / "emb"), "--out", str(out)])
    assert res.exit_code == 0, res.output
    with safe_open(out / "model.safetensors", "pt") as f:
        assert torch.equal(f.get_tensor("embed_tokens.weight").float(), model.embed_tokens.weight.float())


def test_a_frozen_embedding_stays_out_of_checkpoints(eight_layers):
    res, _ = train(eight_layers, "frozen")
    assert res.exit_code == 0, res.output
    ckpts = sorted((eight_layers[2] / "frozen" / "checkpoints").glob("step_*"))
    with safe_open(ckpts[-1] / "model.safetensors", "pt") as f:
        assert "embed_tokens.weight" not in f.keys()
    assert load_drafter(eight_layers[2] / "frozen")[1]["meta"]["trained_embedding"] is False


def test_eagle3_refuses_a_store_of_five_layers(eight_layers):
    target, ds, root = eight_layers
    store = root / "store5"
    res = CliRunner().invoke(
        app,
        [
            "extract",
            str(ds),
            "--target",
            str(target),
            "--out",
            str(store),
            "--aux-layer-ids",
            "2,3,4,5,6",
            "--device",
            "cpu",
        ],
    )
    assert res.exit_code == 0, res.output
    res, _ = train(eight_layers, "from5", "--hidden", str(store))
    text = " ".join(res.output.split())
    assert res.exit_code != 0 and "EAGLE-3 takes exactly 3" in text and "extract a store for --method eagle3" in text
    res, _ = train(eight_layers, "dflash5", "--hidden", str(store), "--method", "dflash", "--paper-settings")
    assert res.exit_code == 0, res.output


def test_plan_sizes_the_paper_settings_drafter(eight_layers):
    """`plan --paper-settings` stands for the same train options: the paper's layers (given ones
    win) and, for DFlash, its five target layers."""
    from draftsmith.plan.config import PlanConfig
    from draftsmith.plan.run import training_config

    plan = PlanConfig(dataset_dir="ds", target="t", method="peagle", paper_settings=True)
    assert (training_config(plan).num_layers, training_config(plan).train_embedding) == (4, True)
    given = PlanConfig(dataset_dir="ds", target="t", method="peagle", paper_settings=True, num_layers=2)
    assert training_config(given).num_layers == 2
    target, ds, _ = eight_layers
    args = ["plan", str(ds), "--target", str(target), "--device", "cpu", "--method", "dflash", "--paper-settings"]
    res = CliRunner().invoke(app, [*args, "--calibrate-tokens", "64"])
    assert res.exit_code == 0, res.output
