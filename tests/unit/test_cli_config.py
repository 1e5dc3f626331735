"""CLI contract: flags beat YAML, YAML beats defaults; placeholders fail loudly."""

import re

import pytest
import yaml
from typer.testing import CliRunner

from draftsmith.cli import ALL_COMMANDS, app
from draftsmith.config import resolve_config
from draftsmith.extract.config import ExtractConfig
from tests.helpers import cli_refused


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


MODULES = {
    "train": "draftsmith.train.run",
    "plan": "draftsmith.plan.run",
    "eval": "draftsmith.evaluate.run",
    "export": "draftsmith.export.run",
}


@pytest.mark.parametrize(
    "command,old,value,field,expected",
    [
        ("train", "--ttt", "3", "depth", 3),
        ("plan", "--ttt", "3", "depth", 3),
        ("plan", "--hidden-dir", "store", "hidden", "store"),
        ("eval", "--k", "auto", "depth", "auto"),
        ("eval", "--k-max", "4", "depth_max", 4),
        ("export", "--speculative-tokens", "5", "depth", 5),
        ("export", "--ckpt", "d", "drafter", "d"),
    ],
)
def test_each_renamed_flag_still_works_with_a_warning(command, old, value, field, expected, tmp_path, monkeypatch):
    """Issue 41's one name per concept: the draft depth is `depth`, the store `hidden`, the
    drafter folder `drafter`; each old spelling is hidden but still taken, with a warning."""
    seen = []
    monkeypatch.setattr(f"{MODULES[command]}.run", seen.append)
    args = {
        "train": ["train", "ds", "--out", str(tmp_path / "o")],
        "plan": ["plan", "ds"],
        "eval": ["eval", "--drafter", "d", "--out", str(tmp_path / "o")],
        "export": ["export", "--out", str(tmp_path / "o")] + (["d"] if old != "--ckpt" else []),
    }[command]
    r = CliRunner().invoke(app, [*args, old, value])
    assert r.exit_code == 0, r.output
    got = getattr(seen[-1], field)
    assert (str(got) if isinstance(expected, str) else got) == expected
    assert f"({old}) is deprecated" in r.output and f"(--{field.replace('_', '-')})" in r.output
    assert not re.search(re.escape(old) + r"(?![\w-])", CliRunner().invoke(app, [command, "--help"]).output)


def test_export_takes_the_drafter_as_a_flag_or_positionally(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr("draftsmith.export.run.run", seen.append)
    out = ["--out", str(tmp_path / "o")]
    for args in (["export", "d", *out], ["export", "--drafter", "d", *out], ["export", "d", "--drafter", "d", *out]):
        r = CliRunner().invoke(app, args)
        assert r.exit_code == 0, r.output
        assert str(seen[-1].drafter) == "d"
    r = CliRunner().invoke(app, ["export", "d", "--drafter", "e", *out])
    assert r.exit_code == 2 and "--drafter and the positional argument differ" in r.output


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


def test_every_option_has_a_one_sentence_help_and_common_names_options():
    """Issue 41: a field's description is its --help line, one sentence of at most 120
    characters (the reasons live in docs/<command>.md); `common` names options that exist."""
    for name, entry in ALL_COMMANDS.items():
        cls = entry.config
        assert set(cls.common) <= set(cls.model_fields), (name, set(cls.common) - set(cls.model_fields))
        for field_name, field in cls.model_fields.items():
            text = field.description or ""
            assert 0 < len(text) <= 120 and text.endswith(".") and ". " not in text, (name, field_name, text)


def test_train_help_lists_common_options_first_then_advanced():
    out = CliRunner().invoke(app, ["train", "--help"], env={"COLUMNS": "200"}).output
    common, advanced = out.split("Advanced options")
    assert all(f"--{o} " in common for o in ("depth", "hidden", "target", "device", "steps", "lr", "out"))
    assert all(f"--{o} " in advanced for o in ("aux-noise", "step-decay", "ttt-positions", "compile-step"))
    assert "--aux-noise" not in common


def test_the_target_options_are_one_block_with_the_same_flags():
    """target, device, dtype (and shard) come from `TargetOptions` / `ShardOption`: one help text each."""
    helps = {}
    for name in ("synth", "extract", "train", "eval", "plan"):
        fields = ALL_COMMANDS[name].config.model_fields
        assert {"target", "device", "dtype"} <= set(fields) and ("shard" in fields) == (name != "eval")
        helps.setdefault("device", set()).add(fields["device"].description)
        helps.setdefault("dtype", set()).add(fields["dtype"].description)
    assert all(len(texts) == 1 for texts in helps.values())


def test_a_missing_positional_argument_is_named_as_the_command_line_spells_it():
    """`train` without its dataset folder names DATASET_DIR, not a --dataset-dir flag it does not
    have; `export` (whose DRAFTER is a flag too) names both spellings."""
    out = cli_refused("train")
    assert "DATASET_DIR: Field required" in out and "--dataset-dir" not in out
    assert "DRAFTER (the positional argument, or --drafter): Field required" in cli_refused("export")


def test_ctrl_c_in_train_says_to_add_resume(monkeypatch):
    """train refuses a rerun of the same command over its checkpoints: the advice names --resume."""
    from typer.testing import CliRunner

    from draftsmith import cli

    def interrupted(cls, yaml_path, flags):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "resolve_config", interrupted)
    res = CliRunner().invoke(cli.app, ["train", "ds", "--out", "o"])
    assert res.exit_code == 130 and "add --resume" in res.output, res.output
    res = CliRunner().invoke(cli.app, ["prepare", "c.jsonl", "--out", "o"])
    assert res.exit_code == 130 and "rerun the same command" in res.output, res.output
