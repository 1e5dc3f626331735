"""`train --method peagle` on the tiny Llama: it trains a P-EAGLE drafter whose drafter.json
records the method and placeholder token, resumes on the same curve, and the commands after it
(export, eval) take it or refuse it with the reason."""

from __future__ import annotations

import shutil

import pytest
import torch
import yaml
from typer.testing import CliRunner

from draftsmith.cli import app
from draftsmith.draft.checkpoint import load_drafter
from draftsmith.train.metrics import read_metrics
from tests.helpers import write_tokenized_dataset
from tests.unit.test_train_loop import _samples

ARGS = ["--steps", "6", "--depth", "3", "--batch-tokens", "96", "--draft-vocab-size", "300", "--log-every", "1"]
ARGS += ["--val-fraction", "0.2", "--save-every", "3", "--lr", "1e-3", "--method", "peagle"]


@pytest.fixture(scope="module")
def peagle_run(tmp_path_factory, tiny_target_dir):
    root = tmp_path_factory.mktemp("peagle")
    ds = write_tokenized_dataset(root / "ds", _samples(10))
    out = root / "run"
    res = CliRunner().invoke(app, ["train", str(ds), "--target", str(tiny_target_dir), "--out", str(out), *ARGS])
    assert res.exit_code == 0, res.output
    return root, ds, out


@pytest.mark.slow
def test_train_method_peagle_writes_a_parallel_drafter(peagle_run):
    _, _, out = peagle_run
    model, record = load_drafter(out)
    assert record["config"]["method"] == "peagle" and model.config.method == "peagle"
    assert model.mask_hidden is not None and model.mask_hidden.shape == (3 * 64,)
    assert 0 <= record["config"]["ptd_token_id"] < model.config.vocab_size
    run = yaml.safe_load((out / "run.yaml").read_text())["config"]
    assert run["method"] == "peagle" and run["step_decay"] == 1.0  # P-EAGLE weighs every depth alike
    train = [r for r in read_metrics(out) if r["split"] == "train"]
    assert [r["step"] for r in train] == [1, 2, 3, 4, 5, 6] and all(len(r["acc_k"]) == 3 for r in train)
    assert train[-1]["loss"] < train[0]["loss"]


@pytest.mark.slow
def test_train_method_peagle_resumes_on_the_same_curve(peagle_run, tiny_target_dir):
    root, ds, out = peagle_run
    cut = root / "cut"
    shutil.copytree(out, cut)
    shutil.rmtree(cut / "checkpoints" / "step_00000006")
    res = CliRunner().invoke(
        app, ["train", str(ds), "--target", str(tiny_target_dir), "--out", str(cut), *ARGS, "--resume"]
    )
    assert res.exit_code == 0, res.output
    whole = {r["step"]: r["loss"] for r in read_metrics(out) if r["split"] == "train"}
    resumed = {r["step"]: r["loss"] for r in read_metrics(cut) if r["split"] == "train"}
    assert set(resumed) == set(whole)
    for step in (4, 5, 6):
        assert resumed[step] == pytest.approx(whole[step], rel=1e-5)
    a, _ = load_drafter(out)
    b, _ = load_drafter(cut)
    torch.testing.assert_close(a.mask_hidden, b.mask_hidden)


def test_for_engine_sglang_is_refused_for_peagle(peagle_run, tiny_target_dir):
    root, ds, _ = peagle_run
    res = CliRunner().invoke(
        app,
        ["train", str(ds), "--target", str(tiny_target_dir), "--out", str(root / "x"), *ARGS, "--for-engine", "sglang"],
    )
    assert res.exit_code != 0 and "SGLang does not serve P-EAGLE" in res.output
    assert not (root / "x").exists()


@pytest.mark.parametrize("fmt", ["eagle", "speculators"])
def test_export_for_vllm_reloads_with_identical_logits(peagle_run, fmt):
    """export's own reload check compares the logits and the slots' input; here the folder is read
    again as eval reads it: the same drafter, method and placeholder, the fields vLLM reads."""
    import json

    root, _, out = peagle_run
    dest = root / f"export-{fmt}"
    res = CliRunner().invoke(app, ["export", str(out), "--format", fmt, "--engine", "vllm", "--out", str(dest)])
    assert res.exit_code == 0, res.output
    config = json.loads((dest / "config.json").read_text())
    if fmt == "eagle":
        assert config["pard_token"] == config["ptd_token_id"] and config["architectures"] == ["LlamaForCausalLMEagle3"]
    else:
        assert config["speculators_model_type"] == "peagle" and "mask_token_id" in config
        assert config["transformer_layer_config"]["fc_norm"] is True
    assert "parallel_drafting" in (dest / "README.md").read_text()
    a, _ = load_drafter(out)
    b, record = load_drafter(dest)
    b.load_target_embeddings(a.embed_tokens.weight)
    assert b.config.method == "peagle" and b.config.ptd_token_id == a.config.ptd_token_id
    g = torch.Generator().manual_seed(0)
    aux = torch.randn(1, 6, a.fc.in_features, generator=g)
    ids, pos = torch.randint(0, a.config.vocab_size, (1, 6), generator=g), torch.arange(6)[None]
    with torch.no_grad():
        assert torch.equal(a(a.project(aux), ids, pos)[0], b(b.project(aux), ids, pos)[0])
        assert torch.equal(a.project(a.mask_hidden[None]), b.project(b.mask_hidden[None]))


def test_export_for_sglang_and_tree_eval_are_refused(peagle_run, tiny_target_dir):
    root, _, out = peagle_run
    res = CliRunner().invoke(
        app, ["export", str(out), "--format", "eagle", "--engine", "sglang", "--out", str(root / "s")]
    )
    assert res.exit_code != 0 and "served by vllm" in res.output and "sglang does not serve" in res.output
    assert not (root / "s").exists()
    res = CliRunner().invoke(
        app,
        ["eval", "--target", str(tiny_target_dir), "--drafter", str(out), "--out", str(root / "e"), "--mode", "tree"],
    )
    assert res.exit_code != 0 and "--mode chain" in res.output, res.output
    assert not (root / "e").exists()


@pytest.mark.slow
def test_eval_chain_runs_on_the_trained_drafter(peagle_run, tiny_target_dir):
    import json

    root, _, out = peagle_run
    res = CliRunner().invoke(
        app,
        ["eval", "--target", str(tiny_target_dir), "--drafter", str(out), "--out", str(root / "ev"), "--depth", "3"]
        + ["--num-questions", "2", "--max-new-tokens", "12", "--device", "cpu"],
    )
    assert res.exit_code == 0, res.output
    report = json.loads((root / "ev" / "report.json").read_text())
    assert report["tau"] >= 1.0 and len(report["accept_per_position"]) == 3


@pytest.mark.slow
def test_status_and_plan_for_peagle(peagle_run, tiny_target_dir):
    root, ds, out = peagle_run
    status = CliRunner().invoke(app, ["status", str(out)])
    assert status.exit_code == 0 and "done" in status.output, status.output
    args = ["plan", str(ds), "--target", str(tiny_target_dir), "--device", "cpu", "--hidden-dir", str(root)]
    plan = CliRunner().invoke(app, [*args, "--calibrate-tokens", "64", "--depth", "3", "--method", "peagle"])
    assert plan.exit_code == 0, plan.output
    assert "train (online)" in plan.output and "TTT-3 step" in plan.output
