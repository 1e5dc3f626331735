"""CLI contract: flags beat YAML, YAML beats defaults; placeholders fail loudly."""

import yaml
from typer.testing import CliRunner

from draftsmith.cli import app
from draftsmith.config import resolve_config
from draftsmith.extract.config import ExtractConfig


def test_precedence_flag_over_yaml_over_default(tmp_path):
    y = tmp_path / "run.yaml"
    y.write_text(yaml.safe_dump({"dataset_dir": "ds", "out": "o", "token_budget": 123, "layers": [1, 2, 3]}))
    cfg = resolve_config(ExtractConfig, y, {"layers": "3,4,5"})
    assert cfg.token_budget == 123  # from YAML
    assert cfg.layers == [3, 4, 5]  # flag beats YAML
    assert cfg.writers == 4  # default


def test_invalid_option_is_a_clear_error(tmp_path):
    r = CliRunner().invoke(app, ["extract", "ds", "--out", str(tmp_path / "o"), "--layers", "1,x"])
    assert r.exit_code == 2
    assert "--layers" in r.output


def test_help_lists_every_stage():
    r = CliRunner().invoke(app, ["--help"])
    for name in ("synth", "prepare", "vocab", "extract", "train", "export", "eval", "plan", "status", "quickstart", "pipeline"):
        assert name in r.output
