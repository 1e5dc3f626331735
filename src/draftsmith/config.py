"""Typed configs shared by every command.

Each command has one pydantic config class (in its stage package) deriving from
`CommandConfig`. Field descriptions become the CLI help. A config is resolved with the
precedence flag > YAML (`--config run.yaml`) > default, and written next to the stage's output
as `run.yaml`, together with the exact command line, so that every output says how it was made.
"""

from __future__ import annotations

import os
import shlex
import sys
import typing
from pathlib import Path
from typing import Any, ClassVar, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from draftsmith.errors import UserError
from draftsmith.fsutil import atomic_write_text
from draftsmith.layers import check_layer_ids

DEFAULT_TARGET = "smollm2-135m"


class CommandConfig(BaseModel):
    """Base for command configs. `positional` names the field given as the positional
    argument on the command line (or None)."""

    # allow_inf_nan=False: every float option of every command is finite (`--lr inf` or `nan` is
    # refused when the options are parsed, not after it has turned the weights to NaN)
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)
    positional: ClassVar[str | None] = None
    # the positional field is also taken as a flag of its own name (export's DRAFTER as --drafter, as eval spells it)
    positional_flag: ClassVar[bool] = False
    # the options `--help` lists first, under "Options"; the others go under "Advanced options" (none: one list)
    common: ClassVar[tuple[str, ...]] = ()
    # option groups, each under its own `--help` heading (before "Advanced options"): heading -> options
    panels: ClassVar[dict[str, tuple[str, ...]]] = {}
    # old option name -> its name now: still taken (flag, --config YAML, pipeline stage) for one
    # release, with a warning on stderr
    renamed: ClassVar[dict[str, str]] = {}

    @classmethod
    def current_names(cls, values: dict[str, Any]) -> dict[str, Any]:
        """`values` with each deprecated option name replaced by its name now, with a warning on
        stderr; where both names are given, the current one's value is kept."""
        if not any(old in values for old in cls.renamed):
            return values
        values = dict(values)
        for old, new in cls.renamed.items():
            if old in values:
                value = values.pop(old)
                print(
                    f"warning: option '{old}' (--{old.replace('_', '-')}) is deprecated and goes in the next release: "
                    f"use '{new}' (--{new.replace('_', '-')})",
                    file=sys.stderr,
                    flush=True,
                )
                values.setdefault(new, value)
        return values

    @model_validator(mode="before")
    @classmethod
    def _renamed_options(cls, values: Any) -> Any:
        return cls.current_names(values) if isinstance(values, dict) else values

    @field_validator("device", check_fields=False)
    @classmethod
    def _device(cls, value: str | None) -> str | None:
        return check_device(value)

    @field_validator("aux_layer_ids", check_fields=False)
    @classmethod
    def _aux_layer_ids(cls, value: list[int] | None) -> list[int] | None:
        """Aux layer ids (extract, plan, train): distinct, non-negative ids, checked before the target
        loads; their count (three for EAGLE-3) once the command knows the drafter's method."""
        try:
            return None if value is None else check_layer_ids(value, count=None)
        except UserError as e:
            raise ValueError(str(e)) from None


def check_device(value: str | None) -> str | None:
    """A `--device` that this machine has: `cpu`, `cuda`, `cuda:N` (N < the GPU count), `mps`..."""
    if value is None:
        return None
    import torch

    try:
        device = torch.device(value)
    except RuntimeError:
        raise ValueError(f"unknown device {value!r}; use cpu, cuda or cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"{value!r}: no CUDA GPU is visible here; use --device cpu, or leave --device out")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        count = torch.cuda.device_count()
        raise ValueError(f"{value!r}: this machine has {count} GPU(s); use cuda:0..cuda:{count - 1}")
    if device.type not in ("cpu", "cuda", "mps", "xpu"):
        raise ValueError(f"device {value!r} is not supported; use cpu or cuda")
    backend = getattr(torch.backends, device.type, None) if device.type in ("mps", "xpu") else None
    if device.type in ("mps", "xpu") and not (backend or getattr(torch, device.type, None)).is_available():
        raise ValueError(f"{value!r}: this machine's PyTorch has no {device.type} device; use --device cpu or cuda")
    return value


def _is_list(annotation: Any) -> bool:
    origin = typing.get_origin(annotation)
    if origin in (list, tuple):
        return True
    return any(_is_list(a) for a in typing.get_args(annotation) if a is not type(None))


def _coerce(cls: type[CommandConfig], values: dict[str, Any]) -> dict[str, Any]:
    """Turn comma-separated CLI strings into lists for list-typed fields (`--aux-layer-ids 2,15,27`)."""
    out = dict(values)
    for name, value in values.items():
        field = cls.model_fields.get(name)
        if field is not None and isinstance(value, str) and _is_list(field.annotation):
            out[name] = [v.strip() for v in value.split(",") if v.strip()]
    return out


def load_yaml_mapping(path: Path, what: str) -> dict[str, Any]:
    """A YAML file that must hold a mapping; UserErrors name the file and say what is wrong."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"{what} {path}: no such file")
    try:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as e:
        raise UserError(f"{what} {path}: not valid YAML ({e})") from None
    except UnicodeDecodeError as e:  # a binary file, another encoding
        raise UserError(f"{what} {path}: not UTF-8 text (byte {e.start}); give a YAML file saved as UTF-8") from None
    except OSError as e:  # a folder, no permission
        raise UserError(f"{what} {path}: cannot be read ({e.strerror}); give a YAML file") from None
    if not isinstance(loaded, dict):
        raise UserError(f"{what} {path}: expected a mapping of names to values")
    return loaded


def resolve_config(cls: type[CommandConfig], yaml_path: Path | None, flags: dict[str, Any]) -> CommandConfig:
    """Build a config from defaults, then the YAML file, then the flags actually given."""
    values: dict[str, Any] = {}
    if yaml_path is not None:
        loaded = load_yaml_mapping(yaml_path, "--config")
        values.update(cls.current_names({k.replace("-", "_"): v for k, v in loaded.items()}))
    values.update(cls.current_names(flags))  # per source, so that a flag beats the YAML under either name
    try:
        return cls(**_coerce(cls, values))
    except ValidationError as e:
        lines = []
        for err in e.errors():  # a field's error names its flag; a check of several (no loc) names its own flags
            loc = ".".join(str(p) for p in err["loc"])
            msg = err["msg"].removeprefix("Value error, ")
            lines.append(f"  {option_name(cls, loc)}: {msg}" if loc else f"  {msg}")
        raise UserError("invalid options:\n" + "\n".join(lines)) from None


def changed_options(cfg: CommandConfig, recorded: dict[str, Any], ignore: set[str]) -> dict[str, tuple[Any, Any]]:
    """The options of `cfg` whose values differ from a config recorded earlier (a pipeline
    marker's or a run.yaml's `config`), but those in `ignore`: {name: (recorded, now)}. A
    recorded name since renamed is read as its new one; an option the record predates counts only
    when it is not at its default."""
    recorded = {type(cfg).renamed.get(k, k): v for k, v in recorded.items()}
    now, fields = cfg.model_dump(mode="json"), type(cfg).model_fields
    return {
        k: (recorded.get(k), now.get(k))
        for k in sorted(now.keys() | recorded.keys())
        if k not in ignore
        and (
            now.get(k) != recorded[k]
            if k in recorded
            else k not in fields
            or fields[k].is_required()
            or getattr(cfg, k) != fields[k].get_default(call_default_factory=True)
        )
    }


RUN_RECORD = "run.yaml"


def is_path_option(cls: type[BaseModel], name: str) -> bool:
    """Whether option `name` of `cls` names files: a Path (or a list of them), or `target` (a local
    folder or file, or an alias)."""
    field = cls.model_fields.get(name)
    if field is None:
        return False
    kinds = {field.annotation, *typing.get_args(field.annotation)}
    return name == "target" or any(k is Path or Path in typing.get_args(k) for k in kinds)


def absolute_paths(cls: type[BaseModel], values: dict[str, Any]) -> dict[str, Any]:
    """`values` (options of `cls` as JSON: given now, or a run.yaml's) with each path option's
    relative path made absolute against the current folder (a target alias, which names no local
    file, is kept), so that a record read from another folder names the same files (issue 55)."""

    def absolute(value: Any) -> Any:
        if isinstance(value, list):
            return [absolute(v) for v in value]
        if isinstance(value, str) and value and not Path(value).is_absolute() and os.path.lexists(value):
            return os.path.abspath(value)
        return value

    return {k: absolute(v) if is_path_option(cls, k) else v for k, v in values.items()}


def write_run_record(out_dir: Path, cfg: CommandConfig, name: str = RUN_RECORD) -> None:
    """Write the resolved config, its paths absolute (`absolute_paths`), and the exact command
    next to a stage's output."""
    record = {
        "command": shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "config": absolute_paths(type(cfg), cfg.model_dump(mode="json")),
    }
    atomic_write_text(Path(out_dir) / name, yaml.safe_dump(record, sort_keys=False))


Shard = Literal["none", "auto"]


class TargetOptions(BaseModel):
    """Mixed into the config of every command that runs the target (synth, extract, train, eval,
    plan): which target, on which device, in which dtype. One definition, one help text."""

    target: str = Field(DEFAULT_TARGET, description="Target model: HF folder, .gguf file, or alias.")
    device: str | None = Field(
        None, description="Device (cpu, cuda, cuda:1); default cuda when available (cuda:LOCAL_RANK under torchrun)."
    )
    dtype: str = Field("auto", description="Target dtype: auto (bf16 on GPU, fp32 on CPU), bf16, fp16 or fp32.")


class ShardOption(BaseModel):
    """Mixed in beside `TargetOptions` where the target may be split over the visible GPUs."""

    shard: Shard = Field(
        "none",
        description="Target weights: none = all on --device; auto = split over every visible GPU (docs/large-targets.md).",
    )


def option_name(cls: type[CommandConfig], field: str) -> str:
    """How the command line spells a field: --max-len, or DATASET_DIR (the positional argument,
    which is a flag too only with `positional_flag`)."""
    flag = f"--{field.replace('_', '-')}"
    if field != cls.positional:
        return flag
    return f"{field.upper()} (the positional argument, or {flag})" if cls.positional_flag else field.upper()
