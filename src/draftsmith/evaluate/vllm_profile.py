"""`eval --engine vllm --vllm-profile N`: where a vLLM engine step's time goes, from the torch
profiler's trace of up to N steps of each engine answering the run's first two questions again
after its timed passes (untimed: the profiler slows what it traces; vLLM's own `ProfilerConfig`).

vLLM's worker names each engine step ("execute_context_..."), and with
VLLM_CUSTOM_SCOPES_FOR_PROFILING=1 (`ENV`, set by the worker) its model runner names the phases
of a step with `record_function` ("gpu_model_runner: preprocess", "forward", "postprocess",
"sample", "draft", "bookkeep", ...; the CPU runner is the same class; vLLM 0.26's GPU model runner
V2 names none, and the line then says so). Per engine this reads,
over the profiled span: the steps, each phase's host time a step, and, where the trace has GPU
kernels, their busy time a step and the share of the span in which no kernel ran (the GPU
waiting on launches and the scheduler). A speculative engine's "draft" phase is its drafter;
"forward" its verification."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

ENV = {"VLLM_CUSTOM_SCOPES_FOR_PROFILING": "1"}  # the model runner's phases as record_function ranges
STEP = "execute_context_"  # the worker's name for one engine step
PHASE = "gpu_model_runner: "
# where the trace names no phase: vLLM 0.26's GPU model runner V2 (its EAGLE-3 and plain engines on an
# H100, 2026-12-05 22:56) has no such ranges; its P-EAGLE engine ran the runner that has them
NO_PHASES = "none named in this trace (this model runner has no phase ranges)"
KERNELS = {"kernel", "gpu_memcpy", "gpu_memset"}  # what occupies the GPU in a torch profiler trace


def profiler_config(folder: Path, steps: int) -> dict[str, Any]:
    """vLLM's `profiler_config` for `steps` engine steps traced into `folder`, after the pass's
    first 4 (its first prefills), the worker's side only, no stacks (small traces)."""
    return {
        "profiler": "torch",
        "torch_profiler_dir": str(folder),
        "delay_iterations": 4,
        "max_iterations": steps,
        "ignore_frontend": True,
        "torch_profiler_with_stack": False,
    }


def busy_us(intervals: list[tuple[float, float]]) -> float:
    """Microseconds covered by the union of (start, end) intervals."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def read_events(folder: Path) -> list[dict[str, Any]]:
    """The complete ('X') events of every trace file under `folder` (.json or .json.gz)."""
    events: list[dict[str, Any]] = []
    for path in sorted(folder.rglob("*.json*")):
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt") as f:
            events += [e for e in json.load(f).get("traceEvents", []) if e.get("ph") == "X" and "dur" in e]
    return events


def summarise(folder: Path) -> dict[str, Any] | None:
    """The step's time by phase (ms a step), kernels' busy ms a step and the GPU's idle share;
    None where no trace with an engine step was written."""
    events = read_events(folder) if folder.is_dir() else []
    phases: dict[str, float] = {}
    for e in events:
        if e.get("cat") == "user_annotation" and e["name"].startswith(PHASE):
            name = e["name"].removeprefix(PHASE)
            phases[name] = phases.get(name, 0.0) + e["dur"]
    steps = sum(1 for e in events if e.get("cat") == "user_annotation" and e["name"].startswith(STEP))
    if not steps:
        return None
    start = min(e["ts"] for e in events)
    span = max(e["ts"] + e["dur"] for e in events) - start
    kernels = [(e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") in KERNELS]
    busy = busy_us(kernels) if kernels else None
    return {
        "steps": steps,
        "span_ms": round(span / 1e3, 3),
        "ms_per_step": round(span / 1e3 / steps, 4),
        "phase_ms_per_step": {k: round(v / 1e3 / steps, 4) for k, v in sorted(phases.items(), key=lambda kv: -kv[1])},
        "kernel_ms_per_step": None if busy is None else round(busy / 1e3 / steps, 4),
        "gpu_idle_share": None if busy is None else round(1 - busy / span, 4),
    }


def summary_line(name: str, s: dict[str, Any]) -> str:
    """One report.md line: an engine's step by phase."""
    phases = ", ".join(f"{k} {v:.2f}" for k, v in s["phase_ms_per_step"].items()) or NO_PHASES
    gpu = (
        ""
        if s["kernel_ms_per_step"] is None
        else f"; GPU kernels {s['kernel_ms_per_step']:.2f} ms a step, no kernel running {100 * s['gpu_idle_share']:.0f} % of the time"
    )
    return f"- vLLM profile, {name}: {s['ms_per_step']:.2f} ms a step over {s['steps']} steps; host time by phase (ms a step): {phases}{gpu}"
