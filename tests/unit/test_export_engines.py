"""Read each export the way vLLM and SGLang do (tests/engine_readers.py, written from the
engines' sources, not from draftsmith.export) and check that the engine captures exactly the
target layers the drafter was trained on, with the same tensors draftsmith trained on."""

import json

import pytest
import torch
from safetensors.torch import load_file

from draftsmith.draft.checkpoint import save_drafter
from draftsmith.export.config import ExportConfig
from draftsmith.export.run import run
from draftsmith.runtime.capture import capture
from tests.engine_readers import never_captured, sglang_view, vllm_view
from tests.helpers import make_tiny_drafter, make_tiny_llama

L = 6
TRAINED = [1, 3, 5]  # draftsmith convention: residual stream entering layers 1, 3, 5
READERS = {"vllm": vllm_view, "sglang": sglang_view}
# the weights each architecture option adds, in the exported folder
OPTION_WEIGHTS = {
    "norm_before_residual": [],
    "norm_before_fc": ["input_norm.weight"],
    "fc_norm": [f"fc_norm.{i}.weight" for i in range(3)],
    "norm_output": [],
}


@pytest.fixture(scope="module")
def target():
    return make_tiny_llama(300, num_layers=L, hidden=64)


@pytest.fixture(scope="module")
def drafter():
    return make_tiny_drafter(aux_layer_ids=TRAINED)


def export(drafter, folder, fmt, engine, **kw):
    save_drafter(drafter, folder / "ckpt", target={"name": "tiny", "num_layers": L, "model_type": "llama"})
    return run(ExportConfig(drafter=folder / "ckpt", format=fmt, engine=engine, out=folder / "out", **kw))


def engine_aux(target, input_ids, layers):
    """What the engine feeds fc: the hidden states entering the captured layers, concatenated.
    Computed with HF's own output_hidden_states, independently of draftsmith's hooks."""
    with torch.no_grad():
        hs = target.model(input_ids=input_ids, output_hidden_states=True).hidden_states  # L+1 x [B, T, H]
    return torch.cat([hs[i] for i in layers], dim=-1)  # [B, T, 3H]


@pytest.mark.parametrize("fmt,engine", [("eagle", "vllm"), ("eagle", "sglang"), ("speculators", "vllm")])
def test_engine_captures_the_trained_layers(tmp_path, target, drafter, fmt, engine):
    out = export(drafter, tmp_path, fmt, engine, include_embeddings=True)
    view = READERS[engine](out, L)
    assert view.captured_layers == TRAINED and never_captured(view, L) == []
    ids = torch.randint(0, 300, (2, 10), generator=torch.Generator().manual_seed(0))
    trained_aux, _ = capture(target, ids, None, TRAINED)
    assert torch.equal(engine_aux(target, ids, view.captured_layers), trained_aux)
    assert not (view.norm_before_residual or view.norm_before_fc or view.fc_norm or view.norm_output)
    assert not view.lm_head_is_embedding
    assert view.fc_in_features == drafter.fc.weight.shape[1] and view.draft_vocab_size == 100
    assert torch.equal(view.draft_to_target, drafter.to_target_ids(torch.arange(100)))
    assert view.skipped == []


def test_every_engine_parameter_is_loaded(tmp_path, drafter):
    for fmt, engine, layer in (
        ("eagle", "vllm", "model.layers.0"),
        ("speculators", "vllm", "model.layers.0"),
        ("eagle", "sglang", "model.layers.0"),  # SGLang 0.5.12 on: midlayer -> layers.0
    ):
        view = READERS[engine](export(drafter, tmp_path / f"{fmt}-{engine}", fmt, engine), L)
        assert len(view.loaded[f"{layer}.self_attn.qkv_proj.weight"]) == 3  # q, k and v shards
        assert len(view.loaded[f"{layer}.mlp.gate_up_proj.weight"]) == 2
        want = {
            f"{layer}.{p}"
            for p in (
                "self_attn.o_proj.weight",
                "mlp.down_proj.weight",
                "input_layernorm.weight",
                "hidden_norm.weight",
                "post_attention_layernorm.weight",
            )
        }
        want |= {"model.fc.weight", "model.norm.weight", "lm_head.weight"}
        assert want <= set(view.loaded), want - set(view.loaded)
        assert "model.embed_tokens.weight" not in view.loaded  # shared from the target by default


def test_sglang_export_is_read_right_by_vllm_too(tmp_path, target, drafter):
    out = export(drafter, tmp_path, "eagle", "sglang")
    assert vllm_view(out, L).captured_layers == TRAINED  # vLLM reads the top-level ids first


def test_the_trap_a_vllm_export_read_by_sglang_is_one_layer_off(tmp_path, drafter):
    """Why --engine matters: SGLang adds 1 to eagle_config's ids."""
    view = sglang_view(export(drafter, tmp_path, "eagle", "vllm"), L)
    assert view.captured_layers == [t + 1 for t in TRAINED] != TRAINED
    assert never_captured(view, L) == [L]


def test_norm_before_residual_missing_means_true_in_vllm(tmp_path):
    """Why norm_before_residual is always written: vLLM's update_eagle3 defaults it to true."""
    out = export(make_tiny_drafter(aux_layer_ids=TRAINED), tmp_path, "speculators", "vllm")
    assert vllm_view(out, L).norm_before_residual is False
    config = json.loads((out / "config.json").read_text())
    del config["norm_before_residual"]
    (out / "config.json").write_text(json.dumps(config))
    assert vllm_view(out, L).norm_before_residual is True


@pytest.mark.parametrize("fmt", ["eagle", "speculators"])
@pytest.mark.parametrize("option", OPTION_WEIGHTS)
def test_vllm_reads_every_architecture_option(tmp_path, fmt, option):
    drafter = make_tiny_drafter(aux_layer_ids=TRAINED, **{option: True})
    view = vllm_view(export(drafter, tmp_path, fmt, "vllm"), L)
    assert {name: getattr(view, name) for name in OPTION_WEIGHTS} == {name: name == option for name in OPTION_WEIGHTS}
    assert all(view.loaded[f"model.{name}"] == [name] for name in OPTION_WEIGHTS[option])
    assert view.skipped == [] and view.fc_in_features == drafter.fc.weight.shape[1]


@pytest.mark.parametrize(
    "option,release", [("fc_norm", (0, 5, 11)), ("norm_output", (0, 5, 11)), ("norm_before_fc", (0, 5, 16))]
)
def test_the_trap_an_older_sglang_drops_the_options_without_error(tmp_path, option, release):
    """Why an SGLang export of these drafters names a release: the one before it loads the folder
    without complaint but serves it without the option."""
    out = export(make_tiny_drafter(aux_layer_ids=TRAINED, **{option: True}), tmp_path, "eagle", "sglang")
    assert getattr(sglang_view(out, L), option) is True and sglang_view(out, L).skipped == []
    view = sglang_view(out, L, release)
    assert getattr(view, option) is False and view.skipped == OPTION_WEIGHTS[option]


def test_norm_before_fc_missing_means_input_norm_skipped_in_vllm(tmp_path):
    """Why norm_before_fc is written at the top level and in eagle_config: without it vLLM skips
    input_norm.weight silently."""
    out = export(make_tiny_drafter(aux_layer_ids=TRAINED, norm_before_fc=True), tmp_path, "eagle", "vllm")
    config = json.loads((out / "config.json").read_text())
    del config["norm_before_fc"], config["eagle_config"]["norm_before_fc"]
    (out / "config.json").write_text(json.dumps(config))
    view = vllm_view(out, L)
    assert view.norm_before_fc is False and view.skipped == ["input_norm.weight"]


@pytest.mark.parametrize("fmt,engine", [("eagle", "vllm"), ("eagle", "sglang"), ("speculators", "vllm")])
def test_a_wider_mlp_is_allocated_at_its_width(tmp_path, fmt, engine):
    """--intermediate-size: each engine sizes the drafter's MLP from the exported config, so a
    width other than the target's must be written there (else its loader fails on the shapes)."""
    out = export(make_tiny_drafter(aux_layer_ids=TRAINED, intermediate_size=200), tmp_path, fmt, engine)
    assert READERS[engine](out, L).intermediate_size == 200
    config = json.loads((out / "config.json").read_text())
    layer = config.get("transformer_layer_config", config)
    layer["intermediate_size"] = 128  # a config that kept the target's width
    (out / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="intermediate_size is 128"):
        READERS[engine](out, L)


@pytest.mark.parametrize("fmt", ["eagle", "speculators"])
def test_vllm_builds_and_loads_every_layer_of_a_deeper_drafter(tmp_path, fmt):
    """--num-layers 3: vLLM builds num_hidden_layers layers (layer 0 on 2H inputs, the others on H)
    and each of its layers' parameters gets the weights of the same draftsmith layer."""
    drafter = make_tiny_drafter(aux_layer_ids=TRAINED, num_layers=3)
    out = export(drafter, tmp_path, fmt, "vllm")
    view = vllm_view(out, L)
    assert view.num_layers == 3 and view.skipped == []
    ours = {f"model.layers.{i}": layer for i, layer in enumerate(drafter.decoder_layers)}
    weights = load_file(str(out / "model.safetensors"))
    for i in range(3):
        assert len(view.loaded[f"model.layers.{i}.self_attn.qkv_proj.weight"]) == 3
        [down] = view.loaded[f"model.layers.{i}.mlp.down_proj.weight"]
        assert torch.equal(weights[down], ours[f"model.layers.{i}"].mlp.down_proj.weight)
    config = json.loads((out / "config.json").read_text())
    (config.get("transformer_layer_config", config))["num_hidden_layers"] = 2  # a config that kept one layer too few
    (out / "config.json").write_text(json.dumps(config))
    with pytest.raises(KeyError, match="layers.2"):
        vllm_view(out, L)


def test_the_trap_an_older_sglang_builds_one_layer(tmp_path):
    """SGLang before 0.5.12 builds `midlayer` alone and skips layers.{i}.* silently."""
    drafter = make_tiny_drafter(aux_layer_ids=TRAINED, num_layers=2)
    view = sglang_view(export(drafter, tmp_path, "eagle", "sglang"), L, (0, 5, 11))
    assert view.num_layers == 1 and view.skipped and all(n.startswith("layers.1.") for n in view.skipped)
