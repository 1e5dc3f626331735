"""The training knobs of issue 13 on the tiny Llama: each architecture option changes the
drafter, the head can start from (and stay at) the target's, both optimizers and every schedule
train, and a non-finite step stops the run without publishing a NaN drafter."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from draftsmith.cli import app
from draftsmith.data.dataset import load_dataset
from draftsmith.draft.checkpoint import load_drafter
from draftsmith.target import final_norm, lm_head_weight, load_target
from draftsmith.train.batching import OnlineSource
from draftsmith.train.config import TrainConfig
from draftsmith.train.metrics import read_metrics
from draftsmith.train.optim import lr_factor
from draftsmith.train.run import build_drafter, resolve_vocab
from tests.helpers import write_tokenized_dataset

ARCH_OPTIONS = ("norm_before_fc", "fc_norm", "norm_output", "norm_before_residual")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    g = np.random.default_rng(0)
    return write_tokenized_dataset(
        tmp_path_factory.mktemp("opts") / "ds",
        [g.integers(3, 400, size=int(g.integers(12, 40))).tolist() for _ in range(12)],
    )


def _train(ds, target_dir, out, *extra):
    res = CliRunner().invoke(
        app,
        [
            "train",
            str(ds),
            "--target",
            str(target_dir),
            "--out",
            str(out),
            "--steps",
            "4",
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
    return res


@pytest.mark.parametrize("option", ARCH_OPTIONS)
def test_each_architecture_option_changes_the_drafter_output(option, dataset, tiny_target_dir):
    target = load_target(str(tiny_target_dir), "cpu", "fp32")
    ds = load_dataset(dataset)
    d2t, t2d = resolve_vocab(
        TrainConfig(dataset_dir=dataset, out=dataset, draft_vocab_size=300), ds, [0, 1], target.info.vocab_size
    )
    aux_layer_ids = target.info.default_aux_layers
    sample = OnlineSource(ds, target.model, aux_layer_ids, 2048, 2048).samples([0])[0]
    aux, ids = sample["aux"][None].float(), sample["input_ids"][None].long()  # [1, T, n_aux*H], [1, T]
    pos = torch.arange(ids.shape[1])[None]  # [1, T]
    outs = []
    for on in (False, True):
        torch.manual_seed(0)
        cfg = TrainConfig(dataset_dir=dataset, out=dataset, **{option: on})
        drafter = build_drafter(target, aux_layer_ids, d2t, t2d, cfg)
        assert getattr(drafter.config, option) is on
        with torch.no_grad():
            for norm in [m for n, m in drafter.named_modules() if n.startswith(("input_norm", "fc_norm.", "norm"))]:
                norm.weight.uniform_(0.5, 1.5)  # untrained norms are the identity on already-normed inputs
            logits, nxt = drafter(drafter.project(aux), ids, pos)
            logits2, _ = drafter(nxt, ids, pos + 1)  # a second draft step reads next_hidden
        outs.append(torch.cat([logits, logits2], dim=-1))
    assert not torch.allclose(outs[0], outs[1], atol=1e-4), f"{option} does not change the drafter"


@pytest.mark.slow
def test_head_from_target_frozen_with_muon(dataset, tiny_target_dir, tmp_path):
    res = _train(
        dataset,
        tiny_target_dir,
        tmp_path / "run",
        "--head-init",
        "target",
        "--freeze-head",
        "--optimizer",
        "muon",
        "--schedule",
        "linear",
        "--lr",
        "1e-2",
        "--norm-before-fc",
        "--norm-output",
    )
    assert res.exit_code == 0, res.output
    model, manifest = load_drafter(tmp_path / "run")
    assert model.config.norm_before_fc and model.config.norm_output
    assert not model.config.fc_norm  # --norm-before-fc alone turns the default per-layer norm off
    target = load_target(str(tiny_target_dir), "cpu", "fp32")
    draft_ids = torch.arange(model.d2t.numel()) + model.d2t
    torch.testing.assert_close(model.lm_head.weight, lm_head_weight(target.model)[draft_ids].float())
    torch.testing.assert_close(model.norm.weight, final_norm(target.model).weight.float())
    lrs = [r["lr"] for r in read_metrics(tmp_path / "run") if r["split"] == "train"]
    assert lrs == sorted(lrs, reverse=True) and lrs[-1] == pytest.approx(0.0, abs=1e-12)  # linear decay to 0


@pytest.mark.slow
@pytest.mark.parametrize("width", ["72", "1.5x"])
def test_intermediate_size_widens_the_drafter_mlp(dataset, tiny_target_dir, tmp_path, width):
    """--intermediate-size: a width, or a multiple of the target's MLP width (what a recipe written
    for one target means for another)."""
    res = _train(dataset, tiny_target_dir, tmp_path / "run", "--intermediate-size", width)
    assert res.exit_code == 0, res.output
    model, _ = load_drafter(tmp_path / "run")
    target = load_target(str(tiny_target_dir), "cpu", "fp32")
    wide = 72 if width == "72" else round(1.5 * target.model.config.intermediate_size)
    assert target.model.config.intermediate_size != wide  # the default would have been the target's
    assert model.config.intermediate_size == wide
    assert model.midlayer.mlp.gate_proj.weight.shape[0] == wide and model.midlayer.mlp.down_proj.weight.shape[1] == wide


@pytest.mark.slow
def test_num_layers_trains_a_deeper_drafter_that_eval_reads(dataset, tiny_target_dir, tmp_path):
    """--num-layers 2: train builds and saves a drafter of two layers (the second a plain layer on
    the hidden state), and it reloads with both, as eval and export load it."""
    res = _train(dataset, tiny_target_dir, tmp_path / "run", "--num-layers", "2", "--steps", "3")
    assert res.exit_code == 0, res.output
    model, _ = load_drafter(tmp_path / "run")
    assert model.config.num_layers == 2 and len(model.extra_layers) == 1
    assert model.extra_layers[0].self_attn.q_proj.weight.shape[1] == model.config.hidden_size


@pytest.mark.parametrize(
    ("given", "parsed"), [(6144, 6144), ("6144", 6144), ("4x", "4x"), (" 1.5x", "1.5x"), (None, None)]
)
def test_intermediate_size_reads_a_width_or_a_multiple(given, parsed, tmp_path):
    cfg = TrainConfig(dataset_dir=tmp_path, out=tmp_path, intermediate_size=given)
    assert cfg.intermediate_size == parsed
    assert cfg.mlp_width(1536) == {6144: 6144, "4x": 6144, "1.5x": 2304, None: 1536}[parsed]  # None: the target's


@pytest.mark.parametrize("given", [0, "0", "-1", "0x", "4y", "x", "4.x", 2.5])
def test_intermediate_size_refuses_what_is_neither(given, tmp_path):
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="give a width"):
        TrainConfig(dataset_dir=tmp_path, out=tmp_path, intermediate_size=given)


@pytest.mark.slow
def test_seeds_share_the_validation_split_and_val_seed_moves_it(dataset, tiny_target_dir, tmp_path):
    """--seed changes the initialisation and the row order, not the held-out samples (so that
    runs of several seeds validate on the same samples); --val-seed changes the split."""
    runs = {}
    for name, extra in {"seed0": [], "seed5": ["--seed", "5"], "val_seed3": ["--val-seed", "3"]}.items():
        res = _train(dataset, tiny_target_dir, tmp_path / name, *extra)
        assert res.exit_code == 0, res.output
        runs[name] = read_metrics(tmp_path / name)
        val = [r for r in runs[name] if r["split"] == "val"][-1]  # and each validation says what it measured
        assert (
            f"[train] validation at step 4: acc_0 {val['acc_0']:.4f}, simulated τ {val['tau']:.3f}, "
            f"walked τ {val['tau_walk']:.3f}"
        ) in res.output, res.output
    val_tokens = {name: [r["valid_tokens"] for r in recs if r["split"] == "val"] for name, recs in runs.items()}
    assert val_tokens["seed0"] == val_tokens["seed5"] != val_tokens["val_seed3"], val_tokens
    train_loss = {name: [r["loss"] for r in recs if r["split"] == "train"] for name, recs in runs.items()}
    assert train_loss["seed0"] != train_loss["seed5"]  # another initialisation and row order


@pytest.mark.parametrize("schedule", ["cosine", "linear", "constant"])
def test_schedules_warm_up_then_decay_as_named(schedule):
    f = lr_factor(schedule, total=10, warmup=2)
    assert [f(0), f(1)] == [0.5, 1.0]
    end = {"cosine": 0.0, "linear": 0.0, "constant": 1.0}[schedule]
    assert f(10) == pytest.approx(end) and f(6) == pytest.approx(
        {"cosine": 0.5, "linear": 0.5, "constant": 1.0}[schedule]
    )


@pytest.mark.slow
def test_a_nan_in_the_data_stops_training_without_publishing_it(dataset, tiny_target_dir, tmp_path, monkeypatch):
    real = OnlineSource.samples

    def poisoned(self, row):
        samples = real(self, row)
        samples[0]["aux"][3] = float("nan")
        return samples

    monkeypatch.setattr(OnlineSource, "samples", poisoned)
    res = _train(dataset, tiny_target_dir, tmp_path / "nan")
    assert res.exit_code != 0
    assert "NaN or Inf" in res.output and "step 1" in res.output
    assert not (tmp_path / "nan" / "drafter").exists()


def test_an_optimizer_state_of_another_shape_is_a_clear_error():
    from draftsmith.errors import UserError
    from draftsmith.train.checkpointing import load_optimizer_state

    model = torch.nn.Linear(2, 2)
    opts = [torch.optim.AdamW(model.parameters())]
    load_optimizer_state(model, opts, [opts[0].state_dict()], fsdp=False)  # the run's own shape loads
    with pytest.raises(UserError, match="optimizer state is not the run's"):
        load_optimizer_state(model, opts, opts[0].state_dict(), fsdp=False)  # an older checkpoint: one dict


def test_aux_noise_scales_with_each_layer_and_only_trains():
    """--aux-noise adds noise of `scale` x each aux layer's own RMS (layers of very different
    scales get proportionate noise), and only in training: validation sees the clean states."""
    from draftsmith.train.loss import noisy

    torch.manual_seed(0)
    aux = torch.cat([torch.randn(1, 4096, 8) * 0.01, torch.randn(1, 4096, 8) * 100.0], dim=-1)  # [1, T, 2*H]
    delta = (noisy(aux, 2, 0.1) - aux).unflatten(-1, (2, -1))  # [1, T, 2, H]
    rel = delta.pow(2).mean((0, 1, 3)).sqrt() / aux.unflatten(-1, (2, -1)).pow(2).mean((0, 1, 3)).sqrt()  # [2]
    assert torch.allclose(rel, torch.full((2,), 0.1), rtol=0.05), rel


def _objective_setup(dataset, target_dir, pad_to=None):
    """A row of the dataset's first two samples through the tiny target (padded to `pad_to`),
    and `outcome(**options)`: a TTTObjective with those options on that row (one drafter for
    all), in train and in eval mode from the same seed -> {mode: (loss, per-step counts)}."""
    from draftsmith.runtime.head import output_head
    from draftsmith.train.batching import collate
    from draftsmith.train.loss import TTTObjective

    target = load_target(str(target_dir), "cpu", "fp32")
    ds = load_dataset(dataset)
    d2t, t2d = resolve_vocab(
        TrainConfig(dataset_dir=dataset, out=dataset, draft_vocab_size=300), ds, [0, 1], target.info.vocab_size
    )
    aux_layer_ids = target.info.default_aux_layers
    batch = collate(OnlineSource(ds, target.model, aux_layer_ids, 2048, 2048).samples([0, 1]), pad_to)
    drafter = build_drafter(target, aux_layer_ids, d2t, t2d, TrainConfig(dataset_dir=dataset, out=dataset))

    def outcome(**options) -> dict[str, tuple[float, dict[str, torch.Tensor]]]:
        objective = TTTObjective(drafter, output_head(target.model), ttt=2, backend="eager", **options)
        out = {}
        for mode in ("train", "eval"):
            getattr(objective, mode)()
            torch.manual_seed(0)
            with torch.no_grad():
                loss, counts = objective(**batch)
            out[mode] = (float(loss), counts)
        return out

    return batch, outcome


def test_aux_noise_changes_training_not_validation(dataset, tiny_target_dir):
    _, outcome = _objective_setup(dataset, tiny_target_dir)
    clean, noisy = outcome(aux_noise=0.0), outcome(aux_noise=0.5)
    assert clean["eval"][0] == noisy["eval"][0] == clean["train"][0]
    assert noisy["train"][0] != clean["train"][0]


def test_teacher_temperature_changes_training_not_validation(dataset, tiny_target_dir):
    """--teacher-temperature sharpens the distribution the drafter learns in training only:
    validation's loss is against the target's own, and no count changes (the argmax is the same)."""
    _, outcome = _objective_setup(dataset, tiny_target_dir)
    plain, sharp = outcome(teacher_temperature=1.0), outcome(teacher_temperature=0.5)
    assert sharp["eval"][0] == plain["eval"][0] == plain["train"][0]
    assert sharp["train"][0] != plain["train"][0]
    for mode in ("train", "eval"):
        for key in ("n_valid", "n_correct", "n_chain"):
            assert torch.equal(sharp[mode][1][key], plain[mode][1][key]), (mode, key)


@pytest.mark.slow
def test_a_second_train_on_one_out_is_refused(dataset, tiny_target_dir, tmp_path):
    """train holds --out's lock for its whole run: a second writer gets a clean error (rc 2)
    naming the holder, and a failed start leaves no folder behind."""
    import os

    from draftsmith.fsutil import output_lock

    out = tmp_path / "run"
    with output_lock(out):
        res = _train(dataset, tiny_target_dir, out)
    assert res.exit_code == 2 and f"another draftsmith process (pid {os.getpid()})" in res.output, res.output
    assert not out.exists()
    res = _train(dataset, tiny_target_dir, tmp_path / "fresh", "--resume")  # nothing to resume: refused, nothing made
    assert res.exit_code == 2 and "holds no training run" in res.output and not (tmp_path / "fresh").exists()
    assert _train(dataset, tiny_target_dir, out).exit_code == 0
    assert _train(dataset, tiny_target_dir, out, "--overwrite").exit_code == 0 and (out / "drafter").is_dir()


@pytest.mark.slow
def test_loss_tokens_all_trains_the_prompt_too_and_validates_the_answers(dataset, tiny_target_dir):
    """--loss-tokens all: in training every token of every sample is a trained position (more
    valid positions than the answer mask gives); in validation the answer mask holds, so val τ
    stays comparable across runs."""
    batch, outcome = _objective_setup(dataset, tiny_target_dir, pad_to=96)  # a padded row
    batch["loss_mask"][:, : batch["loss_mask"].shape[1] // 2] = 0  # a "prompt": the row's first half untrained
    answers, everything = outcome(all_tokens=False), outcome(all_tokens=True)
    n_valid = {
        (name, mode): r[mode][1]["n_valid"].tolist()
        for name, r in (("answers", answers), ("all", everything))
        for mode in ("train", "eval")
    }
    assert n_valid["all", "eval"] == n_valid["answers", "eval"] == n_valid["answers", "train"]
    assert all(a > b for a, b in zip(n_valid["all", "train"], n_valid["answers", "train"], strict=True)), n_valid
    assert TrainConfig(dataset_dir=dataset, out=dataset).loss_tokens == "answers"


def test_one_aux_norm_by_default():
    """The per-layer fc_norm is the default; --norm-before-fc alone switches to the one norm over
    the concatenation (never both unless both are asked for, which export then refuses)."""

    def arch(**kw):
        cfg = TrainConfig(dataset_dir="d", out="o", **kw)
        return cfg.norm_before_fc, cfg.fc_norm

    assert arch() == (False, True)
    assert arch(norm_before_fc=True) == (True, False)
    assert arch(fc_norm=False) == (False, False)
    assert arch(norm_before_fc=True, fc_norm=True) == (True, True)


def test_capture_attention_resolves_per_device_and_refuses_a_model_without_flex(tiny_target_dir, monkeypatch):
    """--capture-attention: auto is flex on CUDA only (on CPU the model's own, dense); flex is
    asked of transformers whatever the device; a model class without flex support is refused
    with the option named, and auto falls back to dense for it."""
    import dataclasses

    from draftsmith.errors import UserError
    from draftsmith.train.run import capture_attention

    target = load_target(str(tiny_target_dir), "cpu", "fp32")
    assert [capture_attention(c, target) for c in ("auto", "dense", "flex")] == [None, None, "flex_attention"]
    on_cuda = dataclasses.replace(target, device=torch.device("cuda", 0))  # resolution only: nothing runs
    assert capture_attention("auto", on_cuda) == "flex_attention"
    monkeypatch.setattr(type(target.model), "_supports_flex_attn", False)
    assert capture_attention("auto", on_cuda) is None
    with pytest.raises(UserError, match="--capture-attention dense"):
        capture_attention("flex", target)


def test_compile_capture_is_refused_where_nothing_is_captured_packed(dataset, tiny_target_dir, tmp_path, monkeypatch):
    """--compile-capture compiles the packed online capture on one device: train runs with it
    and its first log line says so; with --hidden (a store is read), on a target split over
    GPUs, or for a model that cannot be captured packed, it is refused, naming the option and why."""
    from pydantic import ValidationError

    from draftsmith.errors import UserError

    res = _train(dataset, tiny_target_dir, tmp_path / "run", "--compile-capture")
    assert res.exit_code == 0 and "packed capture with the model's own attention, compiled" in res.output, res.output
    res = _train(dataset, tiny_target_dir, tmp_path / "offline", "--compile-capture", "--hidden", str(tmp_path / "s"))
    assert res.exit_code == 2 and "a store's states are read" in res.output, res.output
    assert not (tmp_path / "offline").exists()
    with pytest.raises(ValidationError, match="--compile-capture .* --shard splits the target"):
        TrainConfig(dataset_dir=dataset, out=tmp_path, compile_capture=True, shard="auto")
    target = load_target(str(tiny_target_dir), "cpu", "fp32")
    ds = load_dataset(dataset)
    monkeypatch.setattr("draftsmith.train.batching.packs_sequences", lambda *a: False)  # mixes packed samples
    with pytest.raises(UserError, match="cannot be captured packed; leave --compile-capture out"):
        OnlineSource(ds, target.model, [0, 1, 2], 2048, 2048, compile=True)


def test_a_capture_compile_that_fails_falls_back_to_the_eager_capture(dataset, tiny_target_dir, monkeypatch, capsys):
    """--compile-capture (the recipe's): where the compile fails on its first call, the capture
    goes on eagerly with the same states and one line saying why; a failure after the compiled
    capture has run is raised, not hidden."""
    from draftsmith.runtime.capture import CompiledCapture, capture

    target = load_target(str(tiny_target_dir), "cpu", "fp32")
    ds = load_dataset(dataset)
    eager = OnlineSource(ds, target.model, [0, 1, 2], 2048, 2048)
    want = eager.samples([0, 1, 2])

    def fails(self, ids, pos):
        raise RuntimeError("inductor: no compiler here")

    monkeypatch.setattr(CompiledCapture, "__call__", fails)
    source = OnlineSource(ds, target.model, [0, 1, 2], 2048, 2048, compile=True)
    for _ in range(2):  # the second call goes straight to the eager capture
        got = source.samples([0, 1, 2])
        for g, w in zip(got, want, strict=True):  # the first row padded to the compiled width: fp32 rounding
            assert torch.allclose(g["aux"], w["aux"], atol=1e-5) and torch.allclose(g["final"], w["final"], atol=1e-5)
    assert source.compiled is None
    assert capsys.readouterr().out.count("the capture's compile failed (RuntimeError: inductor: no compiler here)") == 1

    calls = []

    def fails_later(self, ids, pos):  # the first row compiles and runs, the next fails
        calls.append(1)
        if len(calls) > 1:
            raise RuntimeError("out of memory")
        return capture(target.model, ids, None, [0, 1, 2], pos, None)

    monkeypatch.setattr(CompiledCapture, "__call__", fails_later)
    source = OnlineSource(ds, target.model, [0, 1, 2], 2048, 2048, compile=True)
    source.samples([0])
    with pytest.raises(RuntimeError, match="out of memory"):
        source.samples([1])


def test_for_engine_sglang_trains_a_drafter_that_sglang_serves(dataset, tiny_target_dir, tmp_path):
    """The defaults (fc_norm, norm_output) are off, and export --engine sglang for an SGLang before
    0.5.12 takes the drafter that it refuses without the option."""
    for extra, exported in (((), False), (("--for-engine", "sglang"), True)):
        run = tmp_path / f"run{len(extra)}"
        assert _train(dataset, tiny_target_dir, run, *extra).exit_code == 0
        res = CliRunner().invoke(
            app,
            [
                "export",
                str(run),
                "--format",
                "eagle",
                "--engine",
                "sglang",
                "--sglang-release",
                "0.5.11",
                "--out",
                str(tmp_path / f"sglang{len(extra)}"),
            ],
        )
        assert (res.exit_code == 0) is exported, res.output
        assert exported or "train --for-engine sglang" in res.output  # the refusal names the option
    model, _ = load_drafter(tmp_path / "run2")
    assert model.config.num_layers == 1 and not any(getattr(model.config, o) for o in ARCH_OPTIONS)


@pytest.mark.parametrize("extra", [("--norm-output",), ("--fc-norm",), ("--num-layers", "2")])
def test_for_engine_sglang_refuses_what_sglang_cannot_serve(dataset, tiny_target_dir, tmp_path, extra):
    res = _train(dataset, tiny_target_dir, tmp_path / "run", "--for-engine", "sglang", *extra)
    assert res.exit_code != 0 and "--for-engine sglang" in res.output and extra[0] in res.output
    assert not (tmp_path / "run").exists()
