"""The `draftsmith` command line.

Every subcommand is generated from its typed config: each pydantic field becomes an option
(`max_len` -> `--max-len`) whose help is the field's description; the config's `positional`
field is the positional argument. `--config run.yaml` supplies any field, and a flag given on
the command line beats the YAML. The command then calls the stage's `run(cfg)`.

Stage modules are imported only when their command runs, so `--help` stays fast.
"""

from __future__ import annotations

import enum
import importlib
import inspect
import sys
import typing
from pathlib import Path
from typing import Any, Literal, Optional

import typer

from draftsmith.config import CommandConfig, resolve_config
from draftsmith.errors import UserError

# name -> (config class, run function, one-line help)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "synth": ("draftsmith.synth.config:SynthConfig", "draftsmith.synth.run:run",
              "Generate on-policy conversations answered by the target itself."),
    "prepare": ("draftsmith.data.config:PrepareConfig", "draftsmith.data.prepare:run",
                "Tokenize conversations with the target's chat template and assistant-only loss masks."),
    "vocab": ("draftsmith.data.config:VocabConfig", "draftsmith.data.vocab:run",
              "Build the draft vocabulary (d2t offsets, t2d mask) from a tokenized dataset."),
    "extract": ("draftsmith.extract.config:ExtractConfig", "draftsmith.extract.run:run",
                "Capture the target's hidden states into a store on disk."),
    "train": ("draftsmith.train.config:TrainConfig", "draftsmith.train.run:run",
              "Train an EAGLE-3 drafter, offline from a store or online with the target in the loop."),
    "export": ("draftsmith.export.config:ExportConfig", "draftsmith.export.run:run",
               "Export a drafter for vLLM or SGLang."),
    "eval": ("draftsmith.evaluate.config:EvalConfig", "draftsmith.evaluate.run:run",
             "Measure acceptance length and real speed-up with lossless speculative decoding."),
    "plan": ("draftsmith.extract.config:PlanConfig", "draftsmith.extract.plan:run",
             "Estimate disk, memory and time for every stage, checked against free space."),
    "status": ("draftsmith.status:StatusConfig", "draftsmith.status:run",
               "Show progress, rate, ETA, errors and disk use of any stage's output folder."),
    "quickstart": ("draftsmith.pipeline.config:QuickstartConfig", "draftsmith.pipeline.quickstart:run",
                   "Run the whole pipeline on the embedded default target, ending in a tau report."),
    "pipeline": ("draftsmith.pipeline.config:PipelineConfig", "draftsmith.pipeline.run:run",
                 "Run several stages from one YAML config, loading the target once."),
}

app = typer.Typer(
    name="draftsmith", no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
    help="Train EAGLE-3 speculative-decoding drafters for Hugging Face causal LMs, and measure what they are worth.",
)


def _load(path: str) -> Any:
    module, attr = path.split(":")
    return getattr(importlib.import_module(module), attr)


def _cli_type(annotation: Any) -> tuple[Any, str]:
    """Map a field type to a type typer can parse (always Optional: None means 'not given'),
    plus extra help text. Lists and literals travel as strings; pydantic validates them."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, getattr(__import__("types"), "UnionType", None)) and len(args) == 1:
        annotation = args[0]
    if typing.get_origin(annotation) is Literal:
        return Optional[str], "one of: " + ", ".join(map(str, typing.get_args(annotation)))
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return Optional[str], "one of: " + ", ".join(str(m.value) for m in annotation)
    if annotation in (bool, int, float, str, Path):
        return Optional[annotation], ""
    if typing.get_origin(annotation) in (list, tuple):
        return Optional[str], "comma-separated"
    return Optional[str], ""


def _make_command(name: str, config_path: str, run_path: str, help_text: str) -> None:
    cls: type[CommandConfig] = _load(config_path)
    params = []
    for field_name, field in cls.model_fields.items():
        typ, extra = _cli_type(field.annotation)
        default = field.get_default(call_default_factory=True)
        help_parts = [field.description or "", extra]
        if default is not None and not field.is_required():
            help_parts.append(f"(default: {default})")
        elif field.is_required():
            help_parts.append("(required)")
        help_str = " ".join(p for p in help_parts if p)
        opt_name = "--" + field_name.replace("_", "-")
        if field_name == cls.positional:
            info = typer.Argument(None, help=help_str, show_default=False)
        elif typ == Optional[bool]:
            info = typer.Option(None, f"{opt_name}/--no-{opt_name[2:]}", help=help_str, show_default=False)
        else:
            info = typer.Option(None, opt_name, help=help_str, show_default=False)
        params.append(inspect.Parameter(field_name, inspect.Parameter.KEYWORD_ONLY, default=info, annotation=typ))
    params.append(inspect.Parameter(
        "config", inspect.Parameter.KEYWORD_ONLY, annotation=Optional[Path],
        default=typer.Option(None, "--config", help="YAML file of option values; flags given here beat it."),
    ))

    def command(**kwargs: Any) -> None:
        yaml_path = kwargs.pop("config")
        flags = {k: v for k, v in kwargs.items() if v is not None}
        try:
            cfg = resolve_config(cls, yaml_path, flags)
            _load(run_path)(cfg)
        except UserError as e:
            typer.secho(f"error: {e}", fg=typer.colors.RED, err=True)
            raise typer.Exit(e.exit_code) from None
        except KeyboardInterrupt:
            typer.secho("interrupted: rerun the same command to resume", fg=typer.colors.YELLOW, err=True)
            raise typer.Exit(130) from None

    command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    command.__name__ = name
    command.__doc__ = help_text
    app.command(name=name, help=help_text)(command)


for _name, (_cfg, _run, _help) in COMMANDS.items():
    _make_command(_name, _cfg, _run, _help)


def main() -> None:
    # line-buffered output even when piped to a log file
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(line_buffering=True)
    app()


if __name__ == "__main__":
    main()
