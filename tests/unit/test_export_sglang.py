"""export --engine sglang by SGLang release: what each release serves (export/sglang.py), checked
by reading the export the way that release's loader does (tests/engine_readers.py: sglang_view,
written from SGLang's llama_eagle3.py of each release, not from draftsmith.export), and the
mutations of a good export that this check catches."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from draftsmith.draft.checkpoint import save_drafter
from draftsmith.errors import UserError
from draftsmith.export.config import ExportConfig
from draftsmith.export.run import run
from tests.engine_readers import SGLANG_NEWEST, sglang_view, vllm_view
from tests.helpers import make_tiny_drafter

L = 6
TRAINED = [1, 3, 5]
OPTIONS = ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output")
DRAFTERS = {  # the drafters SGLang serves, and the first release that serves each
    "default": ({"fc_norm": True, "norm_output": True}, "0.5.12"),  # train's defaults
    "two layers": ({"fc_norm": True, "norm_output": True, "num_layers": 2}, "0.5.12"),
    "norm_before_fc": ({"norm_before_fc": True, "norm_output": True}, "0.5.17"),
    "fc_norm alone": ({"fc_norm": True}, "0.5.12"),
    "norm_output alone": ({"norm_output": True}, "0.5.12"),
    "two layers alone": ({"num_layers": 2}, "0.5.12"),
    "norm_before_fc alone": ({"norm_before_fc": True}, "0.5.17"),
    "sglang preset": ({}, None),  # train --for-engine sglang: any release
}


def drafter_with(**options):
    """A tiny drafter whose norms are not all ones (so a norm left at its init shows)."""
    model = make_tiny_drafter(aux_layer_ids=TRAINED, **options)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g))
    return model


def export(drafter, folder, engine="sglang", **kw):
    save_drafter(drafter, folder / "ckpt", target={"name": "tiny", "num_layers": L, "model_type": "llama"})
    return run(ExportConfig(drafter=folder / "ckpt", format="eagle", engine=engine, out=folder / "out", **kw))


def misserved(out, drafter, release=SGLANG_NEWEST):
    """What SGLang `release` would serve differently from what `drafter` was trained as: [] when
    it serves it as trained. Compares the layers SGLang captures, each option, the layer count,
    and the tensor each of SGLang's used parameters gets (the stacked q/k/v and gate/up left to
    test_export_engines), with the input norm each later layer applies."""
    view, weights = sglang_view(out, L, release), load_file(str(out / "model.safetensors"))
    cfg = drafter.config
    wrong = [] if view.captured_layers == cfg.aux_layer_ids else [f"captures {view.captured_layers}"]
    wrong += [o for o in OPTIONS if getattr(view, o) != getattr(cfg, o)]
    wrong += [] if view.num_layers == cfg.num_layers else [f"{view.num_layers} layers"]
    wrong += [f"skips {n}" for n in view.skipped]
    ours = {("lm_head.weight" if k == "lm_head.weight" else f"model.{k}"): v for k, v in drafter.state_dict().items()}
    ours = {k: v for k, v in ours.items() if not k.startswith(("model.midlayer.", "model.extra_layers."))}
    for i, layer in enumerate(drafter.decoder_layers):
        for p in ("self_attn.o_proj.weight", "mlp.down_proj.weight", "post_attention_layernorm.weight"):
            ours[f"model.layers.{i}.{p}"] = layer.get_parameter(p)
    ours["model.layers.0.input_layernorm.weight"] = drafter.midlayer.input_layernorm.weight  # on the embedding
    ours["model.layers.0.hidden_norm.weight"] = drafter.midlayer.hidden_norm.weight
    for i, used in enumerate(view.input_norms, start=1):  # a later layer's input norm: the one SGLang applies
        ours[used] = drafter.extra_layers[i - 1].input_layernorm.weight
    for param, value in ours.items():
        if param.endswith(("d2t", "t2d", "embed_tokens.weight")):
            continue
        got = view.loaded.get(param, [])
        if not (got and torch.equal(weights[got[0]], value.detach())):
            wrong.append(f"{param} is not the trained tensor")
    return wrong


@pytest.mark.parametrize("name", DRAFTERS)
def test_sglang_serves_each_drafter_from_its_release(tmp_path, name):
    options, first = DRAFTERS[name]
    drafter = drafter_with(**options)
    out = export(drafter, tmp_path)
    assert misserved(out, drafter) == []
    assert vllm_view(out, L).captured_layers == TRAINED and vllm_view(out, L).skipped == []  # vLLM serves it too
    card = (out / "README.md").read_text()
    assert (f"SGLang {first} or newer" if first else "SGLang (any release with EAGLE-3)") in card
    if first is not None:
        major, minor, patch = (int(x) for x in first.split("."))
        assert misserved(out, drafter, (major, minor, patch)) == []
        assert misserved(out, drafter, (major, minor, patch - 1)) != []  # the release before it does not
        export(drafter, tmp_path / "ok", sglang_release=first)
        with pytest.raises(UserError, match=rf"SGLang {major}\.{minor}\.{patch - 1} cannot serve.*from SGLang {first}"):
            export(drafter, tmp_path / "old", sglang_release=f"{major}.{minor}.{patch - 1}")
        assert not (tmp_path / "old" / "out").exists()  # refused before anything is written


def test_two_layers_name_the_layer_count_and_the_release(tmp_path):
    with pytest.raises(
        UserError, match=r"lacks --num-layers 2, served from SGLang 0\.5\.12.*train --for-engine sglang"
    ):
        export(drafter_with(num_layers=2), tmp_path, sglang_release="0.5.11")


def test_norm_before_residual_is_served_by_no_release(tmp_path):
    with pytest.raises(UserError, match=r"norm_before_residual=true, which no SGLang release serves.*--engine vllm"):
        export(drafter_with(norm_before_residual=True), tmp_path)
    card = (export(drafter_with(norm_before_residual=True), tmp_path / "v", engine="vllm") / "README.md").read_text()
    assert "SGLang cannot serve this drafter: this drafter was trained with norm_before_residual=true" in card


@pytest.mark.parametrize("release,match", [("latest", "give an SGLang release"), ("0.5.23", "with --engine sglang")])
def test_bad_sglang_release(tmp_path, release, match):
    with pytest.raises(UserError, match=match):
        export(drafter_with(), tmp_path, engine="vllm" if release == "0.5.23" else "sglang", sglang_release=release)


def _mutate(out, config=None, drop=()):
    if config is not None:
        c = json.loads((out / "config.json").read_text())
        config(c)
        (out / "config.json").write_text(json.dumps(c))
    weights = load_file(str(out / "model.safetensors"))
    save_file({k: v for k, v in weights.items() if k not in drop}, str(out / "model.safetensors"))


def _ids_one_off(c):
    c["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = c["eagle_aux_hidden_state_layer_ids"]  # vLLM's ids


MUTATIONS = {
    "ids one off": ({"config": _ids_one_off}, "captures [2, 4, 6]"),
    "fc_norm dropped": ({"config": lambda c: c.pop("fc_norm")}, "fc_norm"),
    "fc_norm weights dropped": ({"drop": [f"fc_norm.{i}.weight" for i in range(3)]}, "model.fc_norm.0.weight"),
    "norm_output dropped": ({"config": lambda c: c.pop("norm_output")}, "norm_output"),
    "hidden_norm copy dropped": ({"drop": ["layers.1.hidden_norm.weight"]}, "model.layers.1.hidden_norm.weight"),
}


@pytest.mark.parametrize("mutation", MUTATIONS)
def test_a_mutated_export_is_caught(tmp_path, mutation):
    drafter = drafter_with(fc_norm=True, norm_output=True, num_layers=2)
    out = export(drafter, tmp_path)
    assert misserved(out, drafter) == []
    kw, shows = MUTATIONS[mutation]
    _mutate(out, **kw)
    assert any(shows in w for w in misserved(out, drafter)), misserved(out, drafter)
