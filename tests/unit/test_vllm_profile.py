"""`eval --engine vllm --vllm-profile N`'s trace summary: vLLM's model-runner phases per step, the
GPU kernels' busy time (overlapping kernels counted once) and the share of the span with none
running; a trace without a model-runner step gives no summary."""

from __future__ import annotations

import gzip
import json

import pytest

from draftsmith.evaluate.config import EvalConfig
from draftsmith.evaluate.vllm_profile import busy_us, profiler_config, summarise, summary_line


def step(t0: float) -> list[dict]:
    """One 1,000 µs engine step at t0: forward 400, draft 300, sample 100 µs of host time; kernels
    of 200 + 150 µs, two of them overlapping by 50."""

    def ann(name: str, ts: float, dur: float) -> dict:
        return {"ph": "X", "cat": "user_annotation", "name": f"gpu_model_runner: {name}", "ts": ts, "dur": dur}

    def kern(ts: float, dur: float) -> dict:
        return {"ph": "X", "cat": "kernel", "name": "gemm", "ts": ts, "dur": dur}

    return [
        {"ph": "X", "cat": "user_annotation", "name": "execute_context_0(0)_generation_1(4)", "ts": t0, "dur": 1000},
        ann("forward", t0, 400),
        ann("draft", t0 + 400, 300),
        ann("sample", t0 + 700, 100),
        kern(t0 + 100, 200),
        kern(t0 + 250, 100),  # overlaps the first by 50
        kern(t0 + 900, 100),
        {"ph": "X", "cat": "gpu_user_annotation", "name": "gpu_model_runner: forward", "ts": t0, "dur": 50},
    ]


def test_a_trace_summarised_by_phase_and_gpu_idle_share(tmp_path):
    events = step(0) + step(1000) + [{"ph": "i", "name": "marker", "ts": 5}]
    trace = tmp_path / "spec" / "rank0.pt.trace.json.gz"
    trace.parent.mkdir()
    with gzip.open(trace, "wt") as f:
        json.dump({"traceEvents": events}, f)
    s = summarise(tmp_path / "spec")
    assert s["steps"] == 2 and s["span_ms"] == 2.0 and s["ms_per_step"] == 1.0
    assert s["phase_ms_per_step"] == {"forward": 0.4, "draft": 0.3, "sample": 0.1}  # largest first
    assert s["kernel_ms_per_step"] == 0.35 and s["gpu_idle_share"] == 0.65  # (250 + 100) µs of each 1,000
    line = summary_line("spec", s)
    assert "1.00 ms a step over 2 steps" in line and "forward 0.40, draft 0.30" in line and "65 %" in line


def test_a_cpu_trace_has_no_gpu_figures_and_no_step_gives_none(tmp_path):
    (tmp_path / "cpu").mkdir()
    cpu = [e for e in step(0) if e["cat"] == "user_annotation"]
    (tmp_path / "cpu" / "t.json").write_text(json.dumps({"traceEvents": cpu}))
    s = summarise(tmp_path / "cpu")
    assert s["kernel_ms_per_step"] is None and s["gpu_idle_share"] is None and "GPU" not in summary_line("x", s)
    steps_only = [e for e in cpu if e["name"].startswith("execute_context_")]  # a runner that names no phase
    (tmp_path / "v2").mkdir()
    (tmp_path / "v2" / "t.json").write_text(json.dumps({"traceEvents": steps_only}))
    assert "(ms a step): none named in this trace" in summary_line("spec", summarise(tmp_path / "v2"))
    (tmp_path / "none").mkdir()
    (tmp_path / "none" / "t.json").write_text(json.dumps({"traceEvents": []}))
    assert summarise(tmp_path / "none") is None and summarise(tmp_path / "missing") is None


def test_busy_time_counts_overlaps_once():
    assert busy_us([(0, 10), (5, 15), (20, 25), (21, 22)]) == 20
    assert busy_us([]) == 0


def test_the_profiler_config_and_its_refusal_outside_vllm(tmp_path):
    c = profiler_config(tmp_path, 50)
    assert c["profiler"] == "torch" and c["max_iterations"] == 50 and c["torch_profiler_dir"] == str(tmp_path)
    with pytest.raises(ValueError, match="--vllm-profile traces vLLM's engine: add --engine vllm"):
        EvalConfig(drafter=tmp_path, target="t", out=tmp_path / "o", vllm_profile=10)
