"""CLI contract: flags beat YAML, YAML beats defaults; placeholders fail loudly."""

import pytest
import yaml
from typer.testing import CliRunner

from draftsmith.cli import app
from draftsmith.config import resolve_config
from draftsmith.extract.config import ExtractConfig


def test_precedence_flag_over_yaml_over_default(tmp_path):
    y = tmp_path / "run.yaml"
    y.write_text(yaml.safe_dump({"dataset_dir": "ds", "out": "o", "token_budget": 123, "aux_layer_ids": [1, 2, 3]}))
    cfg = resolve_config(ExtractConfig, y, {"aux_layer_ids": "3,4,5"})
    assert cfg.token_budget == 123  # from YAML
    assert cfg.aux_layer_ids == [3, 4, 5]  # flag beats YAML
    assert cfg.writers == 4  # default


def test_invalid_option_is_a_clear_error(tmp_path):
    r = CliRunner().invoke(app, ["extract", "ds", "--out", str(tmp_path / "o"), "--aux-layer-ids", "1,x"])
    assert r.exit_code == 2
    assert "--aux-layer-ids" in r.output


DEPRECATED_LAYERS = (
    "option 'layers' (--layers) is deprecated and goes in the next release: use 'aux_layer_ids' (--aux-layer-ids)"
)


@pytest.mark.parametrize("command", ["extract", "plan", "train"])
def test_the_old_layers_flag_still_works_with_a_warning(command, tmp_path, monkeypatch):
    """`--layers` was renamed `--aux-layer-ids` (the store's and drafter.json's name): the old
    flag is hidden but still taken, alone or beside a YAML that uses the new name."""
    module = {"extract": "draftsmith.extract.run", "plan": "draftsmith.plan.run", "train": "draftsmith.train.run"}[
        command
    ]
    seen = []
    monkeypatch.setattr(f"{module}.run", seen.append)
    args = [command, "ds"] + (["--out", str(tmp_path / "o")] if command != "plan" else [])
    r = CliRunner().invoke(app, [*args, "--layers", "2,5,8"])
    assert r.exit_code == 0, r.output
    assert seen[-1].aux_layer_ids == [2, 5, 8] and DEPRECATED_LAYERS in r.output
    y = tmp_path / "c.yaml"
    y.write_text(yaml.safe_dump({"aux_layer_ids": [1, 2, 3]}))
    r = CliRunner().invoke(app, [*args, "--config", str(y), "--layers", "2,5,8"])
    assert r.exit_code == 0, r.output
    assert seen[-1].aux_layer_ids == [2, 5, 8]  # the flag beats the YAML under either name
    assert "--layers" not in CliRunner().invoke(app, [command, "--help"]).output


def test_the_old_layers_key_still_works_with_a_warning(tmp_path, capsys):
    y = tmp_path / "run.yaml"
    y.write_text(yaml.safe_dump({"dataset_dir": "ds", "out": "o", "layers": [8, 2, 5]}))
    assert resolve_config(ExtractConfig, y, {}).aux_layer_ids == [2, 5, 8]
    assert DEPRECATED_LAYERS in capsys.readouterr().err
    assert ExtractConfig(dataset_dir="ds", out="o", layers=[2, 5, 8]).aux_layer_ids == [2, 5, 8]  # in code too
    assert DEPRECATED_LAYERS in capsys.readouterr().err


def test_help_lists_every_stage():
    r = CliRunner().invoke(app, ["--help"])
    for name in (
        "synth",
        "prepare",
        "vocab",
        "extract",
        "train",
        "export",
        "eval",
        "plan",
        "status",
        "quickstart",
        "pipeline",
    ):
        assert name in r.output
