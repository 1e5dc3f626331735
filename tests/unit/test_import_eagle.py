"""Third-party EAGLE-3 folders (EAGLE reference / SpecForge, speculators, ModelOpt layouts), built
here by hand, load as draftsmith drafters with the same logits and draftsmith layer ids."""

import json

import pytest
import torch
from safetensors.torch import save_file

from draftsmith.draft.checkpoint import load_drafter
from draftsmith.export.config import ExportConfig
from draftsmith.export.importer import import_drafter
from draftsmith.export.run import run
from tests.conftest import make_tiny_drafter
from tests.unit.test_export_roundtrip import logits


def specforge_config(**extra):
    """Shaped like SpecForge's configs/llama3-8B-eagle3.json: no head_dim, ids in eagle_config."""
    return {
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_act": "silu",
        "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
        "num_hidden_layers": 1, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
        "torch_dtype": "float32", "vocab_size": 300, "draft_vocab_size": 100,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 14, 26]}, **extra,
    }


def write(folder, config, tensors, pickled=False):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    tensors = {k: v.contiguous() for k, v in tensors.items()}
    if pickled:
        torch.save(tensors, folder / "pytorch_model.bin")
    else:
        save_file(tensors, str(folder / "model.safetensors"))
    return folder


@pytest.mark.parametrize("pickled", [True, False])
def test_eagle_specforge_layout_gives_the_same_logits(tmp_path, pickled):
    model = make_tiny_drafter()
    folder = write(tmp_path / "sf", specforge_config(), model.state_dict(), pickled=pickled)
    loaded, manifest = load_drafter(folder)
    assert loaded.config.aux_layer_ids == [2, 15, 27]  # SGLang-convention ids + 1
    assert loaded.config.norm_before_residual is False
    assert torch.equal(logits(loaded), logits(model))
    assert manifest["meta"]["layout"] == "eagle" and manifest["meta"]["needs_target_embeddings"] is False


def test_modelopt_layout_layers_0_names(tmp_path):
    model = make_tiny_drafter()
    state = {k.replace("midlayer.", "layers.0."): v for k, v in model.state_dict().items() if k != "embed_tokens.weight"}
    loaded, manifest = load_drafter(write(tmp_path / "mo", specforge_config(), state))
    assert manifest["meta"]["needs_target_embeddings"] is True
    loaded.load_target_embeddings(model.embed_tokens.weight)
    assert loaded.config.aux_layer_ids == [2, 15, 27]
    assert torch.equal(logits(loaded), logits(model))


def test_speculators_layout_defaults_norm_before_residual_true_like_vllm(tmp_path):
    model = make_tiny_drafter(norm_before_residual=True)
    layer = {k: v for k, v in specforge_config().items() if k not in ("architectures", "draft_vocab_size", "eagle_config")}
    config = {"speculators_model_type": "eagle3", "architectures": ["Eagle3Speculator"], "transformer_layer_config": layer,
              "draft_vocab_size": 100, "eagle_aux_hidden_state_layer_ids": [2, 15, 27],
              "speculators_config": {"algorithm": "eagle3", "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
                                     "default_proposal_method": "greedy",
                                     "verifier": {"name_or_path": "x", "architectures": ["LlamaForCausalLM"]}}}
    state = {k.replace("midlayer.", "layers.0."): v for k, v in model.state_dict().items()}
    state["verifier_norm.weight"] = torch.ones(64)  # speculators may keep a frozen copy; ignored
    loaded, _ = load_drafter(write(tmp_path / "sp", config, state))
    assert loaded.config.norm_before_residual is True and loaded.config.aux_layer_ids == [2, 15, 27]
    assert torch.equal(logits(loaded), logits(model))


def test_convention_override(tmp_path):
    folder = write(tmp_path / "v", specforge_config(eagle_config={"eagle_aux_hidden_state_layer_ids": [2, 15, 27]}),
                   make_tiny_drafter().state_dict())
    model, manifest = import_drafter(folder, convention="vllm")
    assert model.config.aux_layer_ids == [2, 15, 27] and "vllm" in manifest["meta"]["layer_ids_from"]


def test_full_vocab_checkpoint_without_maps_gets_identity(tmp_path):
    model = make_tiny_drafter()
    state = {k: v for k, v in model.state_dict().items() if k not in ("d2t", "t2d", "lm_head.weight")}
    state["lm_head.weight"] = torch.randn(300, 64)
    loaded, _ = load_drafter(write(tmp_path / "full", specforge_config(draft_vocab_size=300), state))
    assert loaded.d2t.abs().sum() == 0 and bool(loaded.t2d.all())


def test_imported_checkpoint_exports_for_both_engines(tmp_path):
    folder = write(tmp_path / "sf", specforge_config(), make_tiny_drafter().state_dict())
    for engine, nested in (("vllm", [2, 15, 27]), ("sglang", [1, 14, 26])):
        out = run(ExportConfig(ckpt=folder, engine=engine, out=tmp_path / engine))
        assert json.loads((out / "config.json").read_text())["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == nested
