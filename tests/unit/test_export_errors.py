"""Bad input to `draftsmith export`: a clear UserError and no output folder."""

import json

import pytest
import torch
from safetensors.torch import save_file

from draftsmith.draft.checkpoint import save_drafter
from draftsmith.errors import UserError
from draftsmith.export.config import ExportConfig
from draftsmith.export.run import run
from tests.helpers import make_tiny_drafter, specforge_config, write_eagle_folder

TARGET = {"name": "t", "num_layers": 30, "model_type": "llama"}


def refused(tmp_path, match, **kw):
    out = tmp_path / "out"
    with pytest.raises(UserError, match=match):
        run(ExportConfig(out=out, **kw))
    assert not out.exists() and not any(p.name.startswith(".out.") for p in tmp_path.iterdir())


def native(tmp_path, **kw):
    save_drafter(make_tiny_drafter(**kw), tmp_path / "ckpt", target=TARGET)
    return tmp_path / "ckpt"


def test_unknown_engine_convention(tmp_path):
    refused(tmp_path, "'tensorrt'.*vllm, sglang", drafter=native(tmp_path), engine="tensorrt")


def test_speculators_layout_is_refused_for_sglang(tmp_path):
    refused(tmp_path, "midlayer", drafter=native(tmp_path), format="speculators", engine="sglang")


@pytest.mark.parametrize("drop", [("d2t", "t2d"), ("d2t",)])
def test_checkpoint_missing_d2t_t2d(tmp_path, drop):
    state = {k: v for k, v in make_tiny_drafter().state_dict().items() if k not in drop}
    ckpt = write_eagle_folder(tmp_path / "sf", specforge_config(), state)
    refused(tmp_path, "no d2t/t2d.*draft vocab \\(100\\) is smaller than the target vocab \\(300\\)", drafter=ckpt)


def test_vocab_size_mismatch_between_config_and_weights(tmp_path):
    ckpt = write_eagle_folder(tmp_path / "sf", specforge_config(vocab_size=301), make_tiny_drafter().state_dict())
    refused(tmp_path, "vocab size mismatch.*t2d", drafter=ckpt)


def test_draft_vocab_size_mismatch(tmp_path):
    ckpt = write_eagle_folder(tmp_path / "sf", specforge_config(draft_vocab_size=120), make_tiny_drafter().state_dict())
    refused(tmp_path, "vocab size mismatch", drafter=ckpt)


def test_d2t_and_t2d_that_disagree(tmp_path):
    state = make_tiny_drafter().state_dict()
    state["t2d"] = torch.roll(state["t2d"], 1)
    refused(tmp_path, "disagree", drafter=write_eagle_folder(tmp_path / "sf", specforge_config(), state))


@pytest.mark.parametrize(
    "ids,match", [([0, 15, 27], "never captured"), ([2, 15, 30], "never captured"), ([2, 15], "exactly 3")]
)
def test_layers_an_engine_cannot_capture(tmp_path, ids, match):
    refused(tmp_path, match, drafter=native(tmp_path, aux_layer_ids=ids))


@pytest.mark.parametrize(
    "option,release,first",
    [("norm_before_fc", "0.5.16", "0.5.17"), ("fc_norm", "0.5.11", "0.5.12"), ("norm_output", "0.5.11", "0.5.12")],
)
def test_architecture_options_an_older_sglang_lacks(tmp_path, option, release, first):
    refused(
        tmp_path,
        rf"SGLang {release} cannot serve this drafter: it lacks {option}=true, served from SGLang {first}.*"
        "--engine vllm.*train --for-engine sglang",
        drafter=native(tmp_path, **{option: True}),
        engine="sglang",
        sglang_release=release,
    )


def test_norm_before_residual_cannot_go_to_sglang(tmp_path):
    refused(
        tmp_path,
        "norm_before_residual=true, which no SGLang release serves.*--engine vllm.*train --for-engine sglang",
        drafter=native(tmp_path, norm_before_residual=True),
        engine="sglang",
    )


@pytest.mark.parametrize("fmt", ["eagle", "speculators"])
def test_norm_before_fc_with_fc_norm_is_served_by_no_engine(tmp_path, fmt):
    ckpt = native(tmp_path, norm_before_fc=True, fc_norm=True)
    refused(
        tmp_path,
        "both norm_before_fc and fc_norm.*vLLM's llama_eagle3 applies input_norm first",
        drafter=ckpt,
        format=fmt,
    )


def test_not_a_drafter_folder(tmp_path):
    folder = tmp_path / "llama"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}))
    save_file({"x": torch.zeros(1)}, str(folder / "model.safetensors"))
    refused(tmp_path, "not an EAGLE-3 drafter", drafter=folder)


def test_bad_eval_report(tmp_path):
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"speedup": 1.0}))
    refused(tmp_path, "no 'tau'", drafter=native(tmp_path), eval_report=report)
