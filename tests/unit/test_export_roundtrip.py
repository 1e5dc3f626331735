"""Export -> reload with `load_drafter` -> identical logits and draftsmith layer ids, for every
format and engine convention; the CLI contract, the model card and atomic output."""

import json
from dataclasses import replace

import pytest
import torch
from safetensors import safe_open
from typer.testing import CliRunner

from draftsmith.cli import app
from draftsmith.draft.checkpoint import load_drafter, save_drafter
from draftsmith.draft.model import Eagle3Drafter
from draftsmith.errors import UserError
from draftsmith.export.config import ExportConfig
from draftsmith.export.run import run
from tests.helpers import draft_logits, make_tiny_drafter

TARGET = {"name": "tiny-target", "num_layers": 30, "model_type": "llama", "hidden_size": 64, "vocab_size": 300}
COMBOS = [("eagle", "vllm"), ("eagle", "sglang"), ("speculators", "vllm")]
OPTIONS = ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output")


def without(model, option):
    """The same weights with `option` off (its norm weights, if any, left out)."""
    plain = Eagle3Drafter(replace(model.config, **{option: False}))
    plain.load_state_dict(model.state_dict(), strict=False)
    return plain.eval()


@pytest.fixture
def ckpt(tmp_path):
    model = make_tiny_drafter()
    save_drafter(model, tmp_path / "ckpt", target=TARGET, meta={"depth": 5, "dataset": "gsm8k (40 conversations)"})
    return model, tmp_path / "ckpt"


@pytest.mark.parametrize("fmt,engine", COMBOS)
@pytest.mark.parametrize("embeddings", [True, False])
def test_round_trip_identical_logits_and_layer_ids(ckpt, tmp_path, fmt, engine, embeddings):
    model, path = ckpt
    out = run(
        ExportConfig(drafter=path, format=fmt, engine=engine, out=tmp_path / "out", include_embeddings=embeddings)
    )
    reloaded, manifest = load_drafter(out)
    assert manifest["meta"]["needs_target_embeddings"] is (not embeddings)
    if not embeddings:  # the engines share the target's embeddings; so does an evaluator
        reloaded.load_target_embeddings(model.embed_tokens.weight)
    assert reloaded.config.aux_layer_ids == [2, 15, 27]
    assert reloaded.config.to_dict() == model.config.to_dict()
    assert torch.equal(draft_logits(reloaded), draft_logits(model))
    assert torch.equal(reloaded.d2t, model.d2t) and torch.equal(reloaded.t2d, model.t2d)
    assert manifest["target"]["num_layers"] == 30


def full_vocab(model: Eagle3Drafter, d2t: torch.Tensor | None = None) -> Eagle3Drafter:
    """`model` with the target's whole vocabulary as its draft vocabulary (a new head), mapped by
    `d2t` offsets (default: the identity, all zeros)."""
    cfg = model.config
    full = Eagle3Drafter(replace(cfg, draft_vocab_size=cfg.vocab_size))
    kept = {k: v for k, v in model.state_dict().items() if k not in ("lm_head.weight", "d2t", "t2d")}
    full.load_state_dict(kept, strict=False)
    full.set_vocab(
        torch.zeros(cfg.vocab_size, dtype=torch.long) if d2t is None else d2t,
        torch.ones(cfg.vocab_size, dtype=torch.bool),
    )
    return full.eval()


@pytest.mark.parametrize("fmt,engine", COMBOS)
def test_a_full_draft_vocab_ships_no_vocab_maps(tmp_path, fmt, engine):
    """vLLM has no draft_id_to_target_id to load d2t into when the draft vocabulary is the
    target's, and refuses to start (LOG 2026-12-06 04:50): such an export ships neither map, and
    reads back as the identity with the same logits. A smaller draft vocabulary keeps both."""
    small = make_tiny_drafter()
    for name, model in (("full", full_vocab(small)), ("small", small)):
        save_drafter(model, tmp_path / name, target=TARGET)
        out = run(ExportConfig(drafter=tmp_path / name, format=fmt, engine=engine, out=tmp_path / f"out-{name}"))
        with safe_open(out / "model.safetensors", "pt") as f:
            maps = {"d2t", "t2d"} & set(f.keys())
        assert maps == (set() if name == "full" else {"d2t", "t2d"})
        reloaded, _ = load_drafter(out)
        reloaded.load_target_embeddings(model.embed_tokens.weight)
        assert torch.equal(draft_logits(reloaded), draft_logits(model))
        assert torch.equal(reloaded.d2t, model.d2t) and torch.equal(reloaded.t2d, model.t2d)


def test_a_reordered_full_draft_vocab_is_refused(tmp_path):
    """The whole vocabulary in another order would need d2t, which no engine loads for a full
    draft vocabulary: refused before anything is written, saying how to rebuild it."""
    swapped = torch.zeros(300, dtype=torch.long)
    swapped[:2] = torch.tensor([1, -1])  # draft ids 0 and 1 are target ids 1 and 0
    save_drafter(full_vocab(make_tiny_drafter(), swapped), tmp_path / "ckpt", target=TARGET)
    with pytest.raises(UserError, match="reordered.*draftsmith vocab"):
        run(ExportConfig(drafter=tmp_path / "ckpt", engine="vllm", out=tmp_path / "out"))
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["eagle", "speculators"])
@pytest.mark.parametrize("option", OPTIONS)
def test_architecture_options_round_trip(tmp_path, fmt, option):
    model = make_tiny_drafter(**{option: True})
    assert not torch.equal(
        draft_logits(model), draft_logits(without(model, option))
    )  # the option changes what is served
    save_drafter(model, tmp_path / "ckpt", target=TARGET)
    out = run(
        ExportConfig(
            drafter=tmp_path / "ckpt", format=fmt, engine="vllm", out=tmp_path / "out", include_embeddings=True
        )
    )
    config = json.loads((out / "config.json").read_text())
    assert {name: config[name] for name in OPTIONS} == {name: name == option for name in OPTIONS}  # all explicit
    if fmt == "eagle":
        assert config["eagle_config"]["norm_before_fc"] is (option == "norm_before_fc")  # where vLLM looks first
    reloaded, _ = load_drafter(out)
    assert reloaded.config.to_dict() == model.config.to_dict()
    assert torch.equal(draft_logits(reloaded), draft_logits(model))


@pytest.mark.parametrize("fmt", ["eagle", "speculators"])
def test_a_wider_mlp_round_trips(tmp_path, fmt):
    model = make_tiny_drafter(intermediate_size=200)
    save_drafter(model, tmp_path / "ckpt", target=TARGET)
    out = run(
        ExportConfig(
            drafter=tmp_path / "ckpt", format=fmt, engine="vllm", out=tmp_path / "out", include_embeddings=True
        )
    )
    reloaded, _ = load_drafter(out)
    assert reloaded.config.intermediate_size == 200 and reloaded.midlayer.mlp.down_proj.weight.shape == (64, 200)
    assert torch.equal(draft_logits(reloaded), draft_logits(model))


@pytest.mark.parametrize("fmt", ["eagle", "speculators"])
def test_a_deeper_drafter_round_trips(tmp_path, fmt):
    """--num-layers 2: the second layer's weights travel as layers.1.* and come back in their place."""
    model = make_tiny_drafter(num_layers=2)
    first_only = Eagle3Drafter(replace(model.config, num_layers=1))
    first_only.load_state_dict(model.state_dict(), strict=False)  # the same weights but the second layer's
    assert not torch.equal(draft_logits(model), draft_logits(first_only.eval()))  # the second layer counts
    save_drafter(model, tmp_path / "ckpt", target=TARGET)
    out = run(
        ExportConfig(
            drafter=tmp_path / "ckpt", format=fmt, engine="vllm", out=tmp_path / "out", include_embeddings=True
        )
    )
    reloaded, _ = load_drafter(out)
    assert reloaded.config.to_dict() == model.config.to_dict()
    assert torch.equal(draft_logits(reloaded), draft_logits(model))
    card = (out / "README.md").read_text()  # the card says so, and the SGLang release that builds the layers
    assert "2 decoder layers" in card
    assert ("SGLang 0.5.12 or newer" in card) is ("sglang.launch_server" in card) is (fmt == "eagle")


def test_bf16_export_matches_bf16_weights(ckpt, tmp_path):
    model, path = ckpt
    out = run(ExportConfig(drafter=path, out=tmp_path / "out", dtype="bfloat16", include_embeddings=True))
    reloaded, _ = load_drafter(out)
    assert torch.equal(draft_logits(reloaded), draft_logits(model.to(torch.bfloat16).float()))
    assert not torch.equal(draft_logits(reloaded), draft_logits(make_tiny_drafter()))  # bf16 rounding is visible


def test_exported_ids_are_in_the_chosen_engines_convention(ckpt, tmp_path):
    _, path = ckpt
    for engine, nested in (("vllm", [2, 15, 27]), ("sglang", [1, 14, 26])):
        out = run(ExportConfig(drafter=path, engine=engine, out=tmp_path / engine))
        config = json.loads((out / "config.json").read_text())
        assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["num_hidden_layers"] == 1
        assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == nested
        assert config["eagle_aux_hidden_state_layer_ids"] == [2, 15, 27]  # vLLM reads this one first
        assert config["draft_vocab_size"] == 100 and "target_hidden_size" not in config  # equal to hidden_size


def test_model_card(ckpt, tmp_path):
    _, path = ckpt
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"tau": 2.345, "accept_per_position": [0.7, 0.5, 0.3], "speedup": 1.8}))
    out = run(ExportConfig(drafter=path, engine="sglang", out=tmp_path / "out", eval_report=report))
    card = (out / "README.md").read_text()
    assert "| draftsmith | [2, 15, 27] |" in card and "| sglang | [1, 14, 26] |" in card
    assert "**2.345**" in card and "1.80x" in card and "0.700, 0.500, 0.300" in card
    assert "gsm8k (40 conversations)" in card and "tiny-target" in card
    assert "--speculative-algorithm EAGLE3" in card and "vllm serve tiny-target" in card


def test_model_card_serves_the_measured_shape(ckpt, tmp_path):
    """An eval report's draft shape goes into the serving commands: a chain's length (vLLM and
    SGLang), a tree's depth, top-k and verified tokens (SGLang; vLLM keeps a chain)."""
    _, path = ckpt
    base = {
        "tau": 2.5,
        "speedup": 1.6,
        "bench": "mt_bench",
        "device": "NVIDIA H200",
        "dtype": "bfloat16",
        "temperature": 0.0,
    }
    chain = {
        **base,
        "mode": "chain",
        "depth": 3,
        "top_k": None,
        "total_tokens": None,
        "shape": {
            "mode": "chain",
            "candidates": [{"shape": f"K={k}", "predicted_speedup": 1 + k / 10} for k in (1, 2, 3)],
        },
    }
    tree = {**base, "mode": "tree", "depth": 6, "top_k": 8, "total_tokens": 32, "shape": None}
    cards = {}
    for name, report in (("chain", chain), ("tree", tree)):
        (tmp_path / f"{name}.json").write_text(json.dumps(report))
        out = run(
            ExportConfig(drafter=path, engine="sglang", out=tmp_path / name, eval_report=tmp_path / f"{name}.json")
        )
        cards[name] = (out / "README.md").read_text()
    assert (
        "a chain of 3 (mt_bench, NVIDIA H200, bfloat16" in cards["chain"]
        and "chosen by `--depth auto` from K=1 (1.10x)" in cards["chain"]
    )
    assert (
        '"num_speculative_tokens": 3' in cards["chain"]
        and "--speculative-eagle-topk 1 --speculative-num-draft-tokens 4" in cards["chain"]
    )
    assert "an EAGLE-2 tree of 32 tokens, depth 6, top-k 8" in cards["tree"]
    assert (
        "--speculative-num-steps 6 \\\n    --speculative-eagle-topk 8 --speculative-num-draft-tokens 33"
        in cards["tree"]
    )
    assert "vLLM drafts a chain" in cards["tree"]


def test_model_card_states_the_options(tmp_path):
    save_drafter(make_tiny_drafter(norm_before_fc=True), tmp_path / "ckpt", target=TARGET)
    card = (run(ExportConfig(drafter=tmp_path / "ckpt", out=tmp_path / "out")) / "README.md").read_text()
    assert "- `norm_before_fc`: true" in card and "- `fc_norm`: false" in card and "- `norm_output`: false" in card
    assert "`norm_before_fc` from 0.5.17" in card and "SGLang 0.5.17 or newer" in card
    assert "vllm serve tiny-target" in card


def test_speculators_config_fields(ckpt, tmp_path):
    _, path = ckpt
    out = run(ExportConfig(drafter=path, format="speculators", out=tmp_path / "out"))
    config = json.loads((out / "config.json").read_text())
    spec = config["speculators_config"]
    assert config["speculators_model_type"] == "eagle3" and config["norm_before_residual"] is False
    assert spec["proposal_methods"][0] == {"proposal_type": "greedy", "speculative_tokens": 5, "verifier_accept_k": 1}
    assert spec["verifier"] == {"name_or_path": "tiny-target", "architectures": ["LlamaForCausalLM"]}
    assert config["transformer_layer_config"]["model_type"] == "llama"


def test_existing_out_needs_overwrite(ckpt, tmp_path):
    _, path = ckpt
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("x")
    with pytest.raises(UserError, match="already exists"):
        run(ExportConfig(drafter=path, out=tmp_path / "out"))
    assert (tmp_path / "out" / "keep.txt").exists()
    with pytest.raises(UserError, match="was not made by `draftsmith export`"):  # --overwrite: only its own output
        run(ExportConfig(drafter=path, out=tmp_path / "out", overwrite=True))
    (tmp_path / "out" / "keep.txt").unlink()
    run(ExportConfig(drafter=path, out=tmp_path / "out", overwrite=True))  # an empty folder
    run(ExportConfig(drafter=path, out=tmp_path / "out", overwrite=True))  # its own output
    assert (tmp_path / "out" / "config.json").exists()


def test_cli(ckpt, tmp_path):
    _, path = ckpt
    result = CliRunner().invoke(
        app, ["export", str(path), "--format", "eagle", "--engine", "sglang", "--out", str(tmp_path / "o")]
    )
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == [
        ".draftsmith",
        "README.md",
        "config.json",
        "model.safetensors",
        "run.yaml",
    ]
    bad = CliRunner().invoke(app, ["export", str(path), "--engine", "tensorrt", "--out", str(tmp_path / "b")])
    assert bad.exit_code == 2 and "tensorrt" in bad.output and not (tmp_path / "b").exists()
