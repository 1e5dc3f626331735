"""The `draftsmith` command line.

Every subcommand is generated from its typed config: each pydantic field becomes an option
(`max_len` -> `--max-len`) whose help is the field's description; the config's `positional`
field is the positional argument (also a flag with `positional_flag`); a config with `common`
lists those options first and the rest under "Advanced options"; `renamed` old names are
hidden flags. `--config run.yaml` supplies any field, and a flag given on
the command line beats the YAML. The command then calls the stage's `run(cfg)`.

The commands come from the registry (`draftsmith.commands`); `quickstart` and `pipeline` are
added here, since they run the registry's commands themselves. Stage modules are imported only
when their command runs, so `--help` stays fast.
"""

from __future__ import annotations

import enum
import inspect
import sys
import types
import typing
from pathlib import Path
from typing import Any, Literal, Optional

import typer

from draftsmith.commands import COMMANDS, Command
from draftsmith.config import resolve_config
from draftsmith.errors import UserError, from_os_error
from draftsmith.memory import memory_error, out_of_memory
from draftsmith.pipeline.config import PipelineConfig, QuickstartConfig


def quickstart(cfg: QuickstartConfig) -> Path:
    from draftsmith.pipeline.quickstart import run

    return run(cfg)


def pipeline(cfg: PipelineConfig) -> Path:
    from draftsmith.pipeline.run import run

    return run(cfg)


# every single-stage command from the registry, then the two that run several stages through it
ALL_COMMANDS: dict[str, Command] = {
    **COMMANDS,
    "quickstart": Command(
        QuickstartConfig, quickstart, "Run the whole pipeline on the embedded default target, ending in a tau report."
    ),
    "pipeline": Command(PipelineConfig, pipeline, "Run several stages from one YAML config, loading the target once."),
}

app = typer.Typer(
    name="draftsmith",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    help="Train EAGLE-3 speculative-decoding drafters for Hugging Face causal LMs, and measure what they are worth.",
)


def _cli_type(annotation: Any) -> tuple[Any, str]:
    """Map a field type to a type typer can parse (always Optional: None means 'not given'),
    plus extra help text. Lists and literals travel as strings; pydantic validates them."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(args) == 1:
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


ADVANCED = "Advanced options"  # the --help panel of the options not in a config's `common`
FLAG = "flag__"  # the parameter name of a positional field's flag spelling (`positional_flag`)


# what to lower when a command runs out of memory (`memory.out_of_memory`), and what became of its output
LOWER = {
    "train": "lower --batch-tokens (or --intermediate-size, --num-layers); the checkpoints written are kept: rerun "
    "with --resume to continue",
    "extract": "lower --token-budget; the samples written are kept: rerun the same command to resume",
    "prepare": "split the data into smaller files and prepare each; nothing was written at --out",
    "eval": "lower --batch-size or --max-new-tokens; nothing was written at --out",
    "synth": "lower --batch-size or --max-new-tokens; the conversations written are kept: rerun the same command to "
    "resume",
}


def fail(e: UserError) -> typing.NoReturn:
    """The one way a command reports a user error: `error: ...` on stderr, its exit code."""
    typer.secho(f"error: {e}", fg=typer.colors.RED, err=True)
    raise typer.Exit(e.exit_code) from None


def _make_command(name: str, entry: Command) -> None:
    cls, help_text = entry.config, entry.help
    params = []
    own = cls.__dict__.get("__annotations__", {})  # the command's own options first, then mixed-in ones (DrafterShape)
    for field_name, field in sorted(cls.model_fields.items(), key=lambda item: item[0] not in own):
        typ, extra = _cli_type(field.annotation)
        default = field.get_default(call_default_factory=True)
        help_parts = [field.description or "", extra]
        if default is not None and not field.is_required():
            help_parts.append(f"(default: {default})")
        elif field.is_required():
            help_parts.append("(required)")
        help_str = " ".join(p for p in help_parts if p)
        opt_name = "--" + field_name.replace("_", "-")
        group = next((heading for heading, names in cls.panels.items() if field_name in names), None)
        panel = group or (ADVANCED if cls.common and field_name not in cls.common else None)
        if field_name == cls.positional:
            info = typer.Argument(None, help=help_str, show_default=False)
            if cls.positional_flag:  # the same field as a flag too: `export DRAFTER` or `export --drafter DRAFTER`
                flag = typer.Option(
                    None, opt_name, help=f"The positional {field_name.upper()}, as a flag.", show_default=False
                )
                params.append(
                    inspect.Parameter(FLAG + field_name, inspect.Parameter.KEYWORD_ONLY, default=flag, annotation=typ)
                )
        elif typ == Optional[bool]:
            info = typer.Option(
                None, f"{opt_name}/--no-{opt_name[2:]}", help=help_str, show_default=False, rich_help_panel=panel
            )
        else:
            info = typer.Option(None, opt_name, help=help_str, show_default=False, rich_help_panel=panel)
        params.append(inspect.Parameter(field_name, inspect.Parameter.KEYWORD_ONLY, default=info, annotation=typ))
    for old, new in cls.renamed.items():  # deprecated flags: hidden, handed to the config under their old name
        typ, _ = _cli_type(cls.model_fields[new].annotation)
        info = typer.Option(None, "--" + old.replace("_", "-"), hidden=True)
        params.append(inspect.Parameter(old, inspect.Parameter.KEYWORD_ONLY, default=info, annotation=typ))
    params.append(
        inspect.Parameter(
            "config",
            inspect.Parameter.KEYWORD_ONLY,
            annotation=Optional[Path],
            default=typer.Option(None, "--config", help="YAML file of option values; flags given here beat it."),
        )
    )

    def command(**kwargs: Any) -> None:
        yaml_path = kwargs.pop("config")
        flags = {k: v for k, v in kwargs.items() if v is not None}
        try:
            if FLAG + str(cls.positional) in flags:  # --drafter D as well as the positional D
                given = flags.pop(FLAG + str(cls.positional))
                if flags.setdefault(cls.positional, given) != given:
                    raise UserError(f"--{cls.positional} and the positional argument differ; give one of them")
            cfg = resolve_config(cls, yaml_path, flags)
            entry.run(cfg)
        except UserError as e:
            fail(e)
        except OSError as e:  # an unwritable --out, a full disk: the path and the fix, no traceback
            fail(from_os_error(e))
        except (MemoryError, RuntimeError, ImportError, SystemError) as e:  # `ulimit -v`, a batch too large
            if not out_of_memory(e):
                raise
            fail(memory_error(name, e, LOWER.get(name, "free some memory")))
        except KeyboardInterrupt:
            how = "add --resume to continue from its last checkpoint" if name == "train" else "rerun the same command"
            typer.secho(f"interrupted: {how}", fg=typer.colors.YELLOW, err=True)
            raise typer.Exit(130) from None

    command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    command.__name__ = name
    command.__doc__ = help_text
    app.command(name=name, help=help_text)(command)


for _name, _entry in ALL_COMMANDS.items():
    _make_command(_name, _entry)


def main() -> None:
    # line-buffered output even when piped to a log file
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(line_buffering=True)
    app()


if __name__ == "__main__":
    main()
