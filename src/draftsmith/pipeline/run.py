"""`draftsmith pipeline CONFIG.yaml`: several stages in one process, the target loaded once.

    out: runs/h200              # stage outputs default to OUT/<stage name>
    target: smollm2-135m        # given to every stage that takes a target, unless it sets one
    stages:
      - synth: {prompts: gsm8k, limit: 5000, max_new_tokens: 256}
      - prepare: {max_len: 2048}
      - train: {steps: 2000}                          # online: no disk
      - export: {format: eagle, engine: vllm}
      - eval: {mode: chain, depth: 7}

Every stage is checked before the first one runs; inputs not given are wired from the latest
earlier stage that produces them (`@NAME` names one); `.pipeline/NAME.started` and `.done`
markers decide what a rerun skips, reruns or refuses; `--only` runs some stages. The rules and
why: docs/pipeline.md.
"""

from __future__ import annotations

import difflib
import json
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from draftsmith.assets import GSM8K_TRAIN
from draftsmith.commands import COMMANDS, STAGES
from draftsmith.config import CommandConfig, changed_options, load_yaml_mapping, resolve_config
from draftsmith.errors import UserError
from draftsmith.fsutil import CONTENT_ID, atomic_write_json, check_output, content_id, made_by, mark_output
from draftsmith.memory import release_memory
from draftsmith.pipeline.config import PipelineConfig
from draftsmith.progress import fmt_duration
from draftsmith.target import shared_targets

# where each command's main input comes from, and what it produces
INPUTS = {
    "prepare": ("data", "synth"),
    "vocab": ("dataset_dir", "prepare"),
    "extract": ("dataset_dir", "prepare"),
    "train": ("dataset_dir", "prepare"),
    "export": ("drafter", "train"),
    "eval": ("drafter", "train"),
}
SHORTCUTS = {"gsm8k": str(GSM8K_TRAIN), "mt_bench": "mt_bench"}
FILE_OUTPUTS = {"synth", "vocab"}  # the commands whose output is a file, not a folder


def default_out(command: str, root: Path, name: str) -> Path:
    if command == "synth":
        return root / "synth" / "conversations.jsonl"  # every synth stage appends to one file
    if command == "vocab":
        return root / name / "vocab.safetensors"
    return root / name


def product(command: str, out: Path) -> Path:
    """The path a later stage reads from a stage's output."""
    return out / "drafter" if command == "train" else out


def parse_stages(raw: Any) -> list[tuple[str, str, dict[str, Any]]]:
    """`[{command: {options}}]` -> [(name, command, options)], names unique."""
    if not isinstance(raw, list) or not raw:
        raise UserError("pipeline config: 'stages' must be a non-empty list like [{synth: {...}}, {prepare: {...}}]")
    stages, seen = [], set()
    for i, entry in enumerate(raw):
        if not isinstance(entry, dict) or len(entry) != 1:
            raise UserError(f"pipeline config: stage {i + 1} must be a one-key mapping {{command: {{options}}}}")
        command, options = next(iter(entry.items()))
        if command not in STAGES:
            raise UserError(f"pipeline config: stage {i + 1}: unknown stage {command!r}")
        if not isinstance(options, dict | None):
            raise UserError(
                f"pipeline config: stage {i + 1} ({command}): options must be a mapping like "
                f"'- {command}: {{out: DIR}}', not a {type(options).__name__}"
            )
        options = dict(options or {})
        name = str(options.pop("name", command))
        if not name or name in (".", "..") or name.startswith(".") or any(c in name for c in "/\\\0"):
            raise UserError(
                f"pipeline config: stage {i + 1} ({command}): name: {name!r} is not a plain name; a stage's "
                "output and markers are named after it inside the pipeline's folder, so give a name without "
                "'/', '\\' or a leading '.', such as 'train_long'"
            )
        if name in seen:
            raise UserError(f"pipeline config: two stages are named {name!r}; give one a 'name:'")
        seen.add(name)
        stages.append((name, command, options))
    return stages


def read_marker(marker: Path) -> dict[str, Any]:
    """A stage's `.started`/`.done` marker, or {} when there is none (or not one this pipeline wrote)."""
    try:
        recorded = json.loads(marker.read_text())
    except (OSError, ValueError):
        return {}
    return recorded if isinstance(recorded, dict) else {}


def made_here(started: Path, out: Path) -> bool:
    """Whether a stage's `.started` marker names `out`: this pipeline made it."""
    return read_marker(started).get("out") == str(out.resolve())


REDO = {"overwrite", "resume"}  # options the pipeline sets itself to run a stage again


def stage_changes(marker: Path, cfg: CommandConfig) -> list[str]:
    """The options of `cfg` that differ from those a stage's `.started`/`.done` marker recorded
    (none when there is no marker, or it predates recorded options)."""
    recorded = read_marker(marker).get("config")
    return list(changed_options(cfg, recorded, REDO)) if isinstance(recorded, dict) else []


def remade_inputs(done: Path, inputs: list[str], marks: Path, runs_now: set[str]) -> list[str]:
    """The inputs of a finished stage (the stages whose output it reads) made again since it
    finished: those that run now, and those whose done marker is not the one its own marker
    recorded (made again in a run since, or new). A marker written before inputs were recorded
    is checked against the stages that run now only."""
    recorded = read_marker(done).get("inputs")
    return [
        f"input {n} made again"
        for n in inputs
        if n in runs_now
        or (isinstance(recorded, dict) and recorded.get(n) != read_marker(marks / f"{n}.done").get("id"))
    ]


def changed_files(done: Path, files: dict[str, str]) -> list[str]:
    """The external inputs of a finished stage (files and folders no stage of this pipeline
    makes) whose content is not what its done marker recorded (`content_id`). A marker written
    before contents were recorded, or with ids of an earlier scheme (a large file's size and
    modification time, which a copy changes; or 4 of its blocks), has none to compare."""
    recorded = read_marker(done).get("files")
    if not isinstance(recorded, dict):
        return []
    return [
        f"input {p} changed"
        for p, cid in files.items()
        if str(recorded.get(p, CONTENT_ID)).startswith(CONTENT_ID) and recorded.get(p) != cid
    ]


def external_files(cfg: CommandConfig, makers: dict[Path, list[str]]) -> dict[str, str]:
    """A stage's external inputs, the paths among its options (a path option, or a target or
    question set given as a path) that exist and that no stage of the pipeline makes, with their
    `content_id`."""
    paths = [Path(v) for k, v in cfg if k != "out" and (isinstance(v, Path) or k in ("target", "bench") and v)]
    return {str(p): content_id(p) for p in paths if p not in makers and p.exists()}


def rerun_options(
    name: str, fields: set[str], values: dict[str, Any], started: Path, chosen: set[str]
) -> dict[str, Any]:
    """What a stage needs to run again over an output it left behind: `resume` (train) or
    `overwrite` (the atomic stages). Given only for an output this pipeline proves it made (the
    stage's `started` marker names it) or an empty folder; an existing output made by anyone else
    is refused. `resume` or `overwrite` among the stage's own options (`chosen`) are left alone;
    given at the top level, for every stage, they never replace an output this pipeline did not make."""
    out = Path(values["out"])
    redo = "resume" if "resume" in fields else "overwrite" if "overwrite" in fields else None
    if redo is None or not out.exists() or {"resume", "overwrite"} & chosen:
        return {}  # nothing to replace, a stage that resumes by itself, or the stage says what to do
    if made_here(started, out):
        return {redo: True}  # cut short in an earlier run of this pipeline
    if out.is_dir() and not any(out.iterdir()):
        return {"overwrite": True} if "overwrite" in fields else {}  # an empty folder: nothing to lose
    how = "'overwrite: true' to replace it" + (
        " or 'resume: true' to continue the run in it" if "resume" in fields else ""
    )
    raise UserError(
        f"pipeline stage {name}: {out} already exists and this pipeline did not make it (no {started}); "
        f"refusing to replace it. Give the stage another 'out:', move {out} away, or give the stage {how}"
    )


@dataclass
class Planned:
    """One stage as it will run: its resolved config and what the markers say about it."""

    name: str
    command: str
    cfg: CommandConfig
    selected: bool  # in --only (or no --only)
    finished: bool  # done earlier with these options and inputs: skipped
    changed: list[str]  # options changed, and inputs made again, since it ran (it runs again)
    inputs: list[str]  # the earlier stages whose output it reads
    files: dict[str, str]  # its external inputs (paths no stage makes) -> their content_id


def check_common(path: Path, common: dict[str, Any], stages: list[tuple[str, str, dict[str, Any]]]) -> None:
    """Refuse a top-level key of pipeline file `path` that no stage takes (`taget:`), naming the
    close match. A deprecated name of an option is taken (and warned about by the stage)."""
    configs = [COMMANDS[command].config for _, command, _ in stages]
    known = set().union(*(cls.model_fields for cls in configs)) - {"out"}
    for key in sorted(set(common) - known - set().union(*(cls.renamed for cls in configs))):
        close = difflib.get_close_matches(key, sorted(known | {"out", "stages"}), n=1)
        hint = f"did you mean '{close[0]}'? " if close else ""
        raise UserError(
            f"{path}: unknown top-level key '{key}': no stage takes it; {hint}"
            f"the top level holds out, stages and options given to every stage that takes them "
            f"({', '.join(sorted(known))})"
        )


def plan_stages(
    root: Path,
    stages: list[tuple[str, str, dict[str, Any]]],
    common: dict[str, Any],
    only: list[str] | None = None,
    recipe: Path | None = None,
) -> list[Planned]:
    """Every stage's config resolved and checked (its options, `@NAME` references, and that its
    output is this pipeline's to replace) before any stage runs: a bad later stage stops the
    pipeline before the first one writes anything. Every file the pipeline has read when a stage
    runs (its `recipe`, and every existing path that stage's or an earlier stage's options name)
    is an input of that stage: no stage's output may replace one."""
    reads = pipeline_inputs(stages, common, recipe)
    marks = root / ".pipeline"
    products: dict[str, Path] = {}
    latest: dict[str, Path] = {}
    makers: dict[Path, list[str]] = {}  # a product -> the stages that make it (every synth stage appends to one file)
    runs_now: set[str] = set()
    planned = []
    for name, command, options in stages:
        cls = COMMANDS[command].config
        values = {k: v for k, v in cls.current_names(common).items() if k in cls.model_fields}
        values["out"] = default_out(command, root, name)
        if command in INPUTS and INPUTS[command][1] in latest:
            values[INPUTS[command][0]] = latest[INPUTS[command][1]]
        if command == "train" and "vocab" in latest:
            values["vocab"] = latest["vocab"]
        for k, v in cls.current_names(options).items():
            if isinstance(v, str) and v.startswith("@"):
                if v[1:] not in products:
                    raise UserError(f"pipeline stage {name}: {k}: {v} names no earlier stage")
                v = products[v[1:]]
            values[k] = SHORTCUTS.get(v, v) if isinstance(v, str) else v
        done, started = marks / f"{name}.done", marks / f"{name}.started"
        out = Path(values["out"])
        inputs = sorted(
            {n for k, v in values.items() if k != "out" and isinstance(v, str | Path) for n in makers.get(Path(v), [])}
        )
        selected = only is None or name in only
        files = external_files(stage_config(name, cls, values), makers) if selected else {}
        changed = stage_changes(done if done.exists() else started, stage_config(name, cls, values)) if selected else []
        if selected and done.exists():
            changed += remade_inputs(done, inputs, marks, runs_now) + changed_files(done, files)
        if changed and made_here(started, out) and "overwrite" in cls.model_fields and not REDO & options.keys():
            values["overwrite"] = True  # start over (not resume) in the output this pipeline made
        elif selected and (changed or not done.exists()):
            values.update(rerun_options(name, set(cls.model_fields), values, started, set(options)))
        finished = done.exists() and not changed
        if selected and not finished:
            runs_now.add(name)
            check_stage_out(root, name, command, values, options, started, reads[len(planned)])
        planned.append(
            Planned(name, command, stage_config(name, cls, values), selected, finished, changed, inputs, files)
        )
        products[name] = latest[command] = product(command, out)
        makers.setdefault(products[name], []).append(name)
    return planned


def pipeline_inputs(
    stages: list[tuple[str, str, dict[str, Any]]], common: dict[str, Any], recipe: Path | None
) -> list[list[Path]]:
    """For each stage, the files the pipeline has read by the time it runs: its recipe, and the
    existing paths that its options or an earlier stage's name (a file a later stage reads is
    that stage's input, which an earlier stage may make)."""
    found = [recipe] if recipe is not None else []
    reads = []
    for _, _, options in stages:
        for key, v in {**common, **options}.items():
            if (
                key != "out"
                and isinstance(v, str)
                and not v.startswith("@")
                and v not in SHORTCUTS
                and Path(v).exists()
            ):
                found.append(Path(v))
        reads.append(list(found))
    return reads


def check_stage_out(
    root: Path,
    name: str,
    command: str,
    values: dict[str, Any],
    options: dict[str, Any],
    started: Path,
    read: list[Path] | None = None,
) -> None:
    """A stage's output, checked as the stage checks it alone (`check_output`), and inside the
    pipeline's folder unless its `out:` is an absolute path. Its `overwrite` is the stage's own
    except over an output this pipeline made (its `.started` marker names it: made by draftsmith)."""
    out, given = Path(values["out"]), options.get("out")
    if given is not None and not Path(given).is_absolute() and root.resolve() not in out.resolve().parents:
        raise UserError(
            f"pipeline stage {name}: out: {given} is outside the pipeline's folder {root}; give a path "
            "inside it (relative paths are taken from the current folder, as the pipeline's out: is), or an "
            "absolute path to write elsewhere"
        )
    inputs = [v for k, v in values.items() if k != "out" and isinstance(v, str | Path)] + (read or [])
    overwrite = bool(values.get("overwrite")) and not made_here(started, out)
    try:
        check_output(out, command, inputs, overwrite, folder=command not in FILE_OUTPUTS)
    except UserError as e:
        raise UserError(f"pipeline stage {name}: {e}") from None


def stage_config(name: str, cls: type[CommandConfig], values: dict[str, Any]) -> CommandConfig:
    """`resolve_config`, with the stage named in its error."""
    try:
        return resolve_config(cls, None, values)
    except UserError as e:
        raise UserError(f"pipeline stage {name}: {e}") from None


def run_stages(
    root: Path,
    stages: list[tuple[str, str, dict[str, Any]]],
    common: dict[str, Any],
    only: list[str] | None = None,
    recipe: Path | None = None,
) -> dict[str, Path]:
    """Check every stage, then run them in order inside one process (only the `only` ones, when
    given); returns each stage's product path."""
    planned = plan_stages(root, stages, common, only, recipe)
    marks = root / ".pipeline"
    marks.mkdir(parents=True, exist_ok=True)
    with shared_targets():
        for stage in planned:
            cfg, out = stage.cfg, Path(stage.cfg.out)
            done, started = marks / f"{stage.name}.done", marks / f"{stage.name}.started"
            if not stage.selected:
                print(f"[pipeline] {stage.name}: not selected ({out})", flush=True)
                continue
            if stage.finished:
                print(f"[pipeline] {stage.name}: done earlier, skipped ({out})", flush=True)
                continue
            if stage.changed:  # stale output: made by this pipeline with other options or inputs
                print(
                    f"[pipeline] {stage.name}: changed since it ran ({', '.join(stage.changed)}): running it again",
                    flush=True,
                )
                done.unlink(missing_ok=True)
            print(f"[pipeline] {stage.name}: draftsmith {stage.command} -> {out}", flush=True)
            if stage.command not in FILE_OUTPUTS and out.is_dir() and made_by(out) is None and made_here(started, out):
                mark_output(out, stage.command)  # made by this pipeline before outputs were marked: its to replace
            atomic_write_json(
                started, {"command": stage.command, "out": str(out.resolve()), "config": cfg.model_dump(mode="json")}
            )
            t0 = time.time()
            COMMANDS[stage.command].run(cfg)
            release_memory()  # what the stage held goes before the next stage allocates
            atomic_write_json(
                done,
                {
                    "command": stage.command,
                    "seconds": round(time.time() - t0, 1),
                    "config": cfg.model_dump(mode="json"),
                    "id": uuid.uuid4().hex,
                    "inputs": {n: read_marker(marks / f"{n}.done").get("id") for n in stage.inputs},
                    "files": stage.files,
                },
            )
    print(f"[pipeline] {stage_times(planned, marks)}", flush=True)
    return {stage.name: product(stage.command, Path(stage.cfg.out)) for stage in planned}


def stage_times(planned: list[Planned], marks: Path) -> str:
    """Where the pipeline's time went: each selected stage's seconds from its `.done` marker (a
    stage done by an earlier run marked so), and their sum."""
    parts, total = [], 0.0
    for stage in planned:
        seconds = read_marker(marks / f"{stage.name}.done").get("seconds") if stage.selected else None
        if isinstance(seconds, int | float):
            total += seconds
            parts.append(f"{stage.name} {fmt_duration(seconds)}" + (" (earlier)" if stage.finished else ""))
    return f"stage times: {', '.join(parts)}; total {fmt_duration(total)}" if parts else "stage times: none recorded"


def run(cfg: PipelineConfig) -> Path:
    path = Path(cfg.pipeline_config)
    spec = load_yaml_mapping(path, "pipeline config")
    # flag > YAML > default, as for every command: a recipe template names no machine's paths
    yaml_out = spec.pop("out", None)
    root = Path(cfg.out or yaml_out or Path("runs") / path.stem)
    stages = parse_stages(spec.pop("stages", None))
    unknown = sorted(set(cfg.only or []) - {name for name, _, _ in stages})
    if unknown:
        raise UserError(
            f"--only {','.join(unknown)}: {path} has no such stage; its stages: {', '.join(n for n, _, _ in stages)}"
        )
    check_common(path, spec, stages)
    if cfg.target is not None:
        spec["target"] = cfg.target  # to the stages that take a target, as the YAML's `target:`
    run_stages(root, stages, common=spec, only=cfg.only, recipe=path)
    return root
