"""Third-party EAGLE-3 folders (EAGLE reference / SpecForge, speculators, ModelOpt layouts), built
here by hand, load as draftsmith drafters with the same logits and draftsmith layer ids."""

import json

import pytest
import torch

from draftsmith.draft.checkpoint import load_drafter
from draftsmith.draft.importer import import_drafter
from draftsmith.errors import UserError
from draftsmith.export.config import ExportConfig
from draftsmith.export.run import run
from tests.helpers import draft_logits, make_tiny_drafter, specforge_config, write_eagle_folder


def speculators_training_config():
    """config.json as speculators 0.9.0's Eagle3DraftModel.save_pretrained writes it (field names from
    Eagle3SpeculatorConfig and SpeculatorModelConfig; the eagle3 training defaults norm_before_fc,
    norm_output and norm_before_residual on), for make_tiny_drafter's shapes."""
    layer = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "num_hidden_layers": 1,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 4096,
        "vocab_size": 300,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
    }
    return {
        "architectures": ["Eagle3DraftModel"],
        "model_type": "speculator_model",
        "speculators_model_type": "eagle3",
        "speculators_version": "0.9.0",
        "transformer_layer_config": layer,
        "draft_vocab_size": 100,
        "target_hidden_size": None,
        "eagle_aux_hidden_state_layer_ids": [2, 15, 27],
        "norm_before_residual": True,
        "norm_before_fc": True,
        "fc_norm": False,
        "norm_output": True,
        "embed_requires_grad": False,
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [
                {"proposal_type": "greedy", "speculative_tokens": 3, "accept_tolerance": 0.0, "verifier_accept_k": 1}
            ],
            "verifier": {"name_or_path": "tiny-target", "architectures": ["LlamaForCausalLM"]},
        },
        "torch_dtype": "float32",
        "transformers_version": "5.0.0",
    }


@pytest.mark.parametrize("pickled", [True, False])
def test_eagle_specforge_layout_gives_the_same_logits(tmp_path, pickled):
    model = make_tiny_drafter()
    folder = write_eagle_folder(tmp_path / "sf", specforge_config(), model.state_dict(), pickled=pickled)
    loaded, manifest = load_drafter(folder)
    assert loaded.config.aux_layer_ids == [2, 15, 27]  # SGLang-convention ids + 1
    assert loaded.config.norm_before_residual is False
    assert torch.equal(draft_logits(loaded), draft_logits(model))
    assert manifest["meta"]["layout"] == "eagle" and manifest["meta"]["needs_target_embeddings"] is False


def test_modelopt_layout_layers_0_names(tmp_path):
    model = make_tiny_drafter()
    state = {
        k.replace("midlayer.", "layers.0."): v for k, v in model.state_dict().items() if k != "embed_tokens.weight"
    }
    loaded, manifest = load_drafter(write_eagle_folder(tmp_path / "mo", specforge_config(), state))
    assert manifest["meta"]["needs_target_embeddings"] is True
    loaded.load_target_embeddings(model.embed_tokens.weight)
    assert loaded.config.aux_layer_ids == [2, 15, 27]
    assert torch.equal(draft_logits(loaded), draft_logits(model))


def test_speculators_layout_defaults_norm_before_residual_true_like_vllm(tmp_path):
    model = make_tiny_drafter(norm_before_residual=True)
    layer = {
        k: v for k, v in specforge_config().items() if k not in ("architectures", "draft_vocab_size", "eagle_config")
    }
    config = {
        "speculators_model_type": "eagle3",
        "architectures": ["Eagle3Speculator"],
        "transformer_layer_config": layer,
        "draft_vocab_size": 100,
        "eagle_aux_hidden_state_layer_ids": [2, 15, 27],
        "speculators_config": {
            "algorithm": "eagle3",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": "x", "architectures": ["LlamaForCausalLM"]},
        },
    }
    state = {k.replace("midlayer.", "layers.0."): v for k, v in model.state_dict().items()}
    state["verifier_norm.weight"] = torch.ones(64)  # speculators may keep a frozen copy; ignored
    loaded, _ = load_drafter(write_eagle_folder(tmp_path / "sp", config, state))
    assert loaded.config.norm_before_residual is True and loaded.config.aux_layer_ids == [2, 15, 27]
    assert torch.equal(draft_logits(loaded), draft_logits(model))


@pytest.mark.parametrize("embeddings", [True, False])
def test_speculators_training_checkpoint_loads_and_exports(tmp_path, embeddings):
    """A speculators 0.9.0 training output: input_norm, the verifier's frozen norm / lm_head, maybe no
    embed_tokens. It loads through load_drafter (what eval and export use) with identical logits."""
    model = make_tiny_drafter(norm_before_residual=True, norm_before_fc=True, norm_output=True)
    state = {
        k.replace("midlayer.", "layers.0."): v
        for k, v in model.state_dict().items()
        if embeddings or k != "embed_tokens.weight"
    }
    state |= {"verifier_norm.weight": torch.ones(64), "verifier_lm_head.weight": torch.randn(100, 64)}
    assert "input_norm.weight" in state
    folder = write_eagle_folder(tmp_path / "trained", speculators_training_config(), state)
    loaded, manifest = load_drafter(folder)
    assert manifest["meta"]["needs_target_embeddings"] is (not embeddings)
    loaded.load_target_embeddings(model.embed_tokens.weight)
    assert loaded.config.to_dict() == model.config.to_dict()
    assert torch.equal(draft_logits(loaded), draft_logits(model))
    for fmt in ("eagle", "speculators"):
        exported, _ = load_drafter(run(ExportConfig(drafter=folder, format=fmt, out=tmp_path / f"out-{fmt}")))
        exported.load_target_embeddings(model.embed_tokens.weight)
        assert exported.config.to_dict() == model.config.to_dict()
        assert torch.equal(draft_logits(exported), draft_logits(model))


def test_speculators_checkpoint_of_two_layers_loads(tmp_path):
    """speculators' --num-layers 2: transformer_layer_config.num_hidden_layers 2, the second layer a
    plain Llama layer named layers.1.* (no hidden_norm, H-wide q/k/v). A weight count that disagrees
    with the config is refused by name."""
    model = make_tiny_drafter(norm_before_residual=True, norm_before_fc=True, norm_output=True, num_layers=2)
    state = {
        k.replace("midlayer.", "layers.0.").replace("extra_layers.0.", "layers.1."): v
        for k, v in model.state_dict().items()
    }
    assert state["layers.1.self_attn.q_proj.weight"].shape == (64, 64) and "layers.1.hidden_norm.weight" not in state
    config = speculators_training_config()
    config["transformer_layer_config"]["num_hidden_layers"] = 2
    unused = {"layers.1.hidden_norm.weight": torch.ones(64)}  # vLLM builds it in every layer and uses layer 0's alone
    loaded, _ = load_drafter(write_eagle_folder(tmp_path / "two", config, state | unused))
    assert loaded.config.num_layers == 2 and loaded.config.to_dict() == model.config.to_dict()
    assert torch.equal(draft_logits(loaded), draft_logits(model))
    config["transformer_layer_config"]["num_hidden_layers"] = 1
    with pytest.raises(UserError, match="num_hidden_layers 1, but the weights hold 2 decoder layer"):
        load_drafter(write_eagle_folder(tmp_path / "one", config, state))


def test_norm_before_fc_in_eagle_config_is_read_first_like_vllm(tmp_path):
    """NVIDIA's EAGLE-3 checkpoints state norm_before_fc inside eagle_config; vLLM reads it there first."""
    model = make_tiny_drafter(norm_before_fc=True)
    config = specforge_config(
        norm_before_fc=False, eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 14, 26], "norm_before_fc": True}
    )
    loaded, _ = load_drafter(write_eagle_folder(tmp_path / "nv", config, model.state_dict()))
    assert loaded.config.norm_before_fc is True
    assert torch.equal(draft_logits(loaded), draft_logits(model))


def test_convention_override(tmp_path):
    folder = write_eagle_folder(
        tmp_path / "v",
        specforge_config(eagle_config={"eagle_aux_hidden_state_layer_ids": [2, 15, 27]}),
        make_tiny_drafter().state_dict(),
    )
    model, manifest = import_drafter(folder, convention="vllm")
    assert model.config.aux_layer_ids == [2, 15, 27] and "vllm" in manifest["meta"]["layer_ids_from"]


def test_full_vocab_checkpoint_without_maps_gets_identity(tmp_path):
    model = make_tiny_drafter()
    state = {k: v for k, v in model.state_dict().items() if k not in ("d2t", "t2d", "lm_head.weight")}
    state["lm_head.weight"] = torch.randn(300, 64)
    loaded, _ = load_drafter(write_eagle_folder(tmp_path / "full", specforge_config(draft_vocab_size=300), state))
    assert loaded.d2t.abs().sum() == 0 and bool(loaded.t2d.all())


def test_imported_checkpoint_exports_for_both_engines(tmp_path):
    folder = write_eagle_folder(tmp_path / "sf", specforge_config(), make_tiny_drafter().state_dict())
    for engine, nested in (("vllm", [2, 15, 27]), ("sglang", [1, 14, 26])):
        out = run(ExportConfig(drafter=folder, engine=engine, out=tmp_path / engine))
        assert (
            json.loads((out / "config.json").read_text())["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == nested
        )
