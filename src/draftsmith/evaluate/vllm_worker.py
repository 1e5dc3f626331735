"""The vLLM side of `draftsmith eval --engine vllm`, run as its own process:

    python -m draftsmith.evaluate.vllm_worker REQUEST.json RESULT.json

vLLM spawns engine processes, so its `LLM` is only ever made here, under `__main__`. One worker
serves several engines in turn (`engines`: each a drafter folder as vLLM serves it, or null for
plain decoding), so that several drafters pay vLLM's import once: per engine a warm-up, then per
batch size every question turn by turn (evaluate/run.py's `answer`), each call timed, with vLLM's
own counters before and after; the engine is dropped before the next one starts.

REQUEST: target (an HF folder), tokenizer (the target spec draftsmith reads it from),
chat_template, completion, questions [{question_id, category, turns}], dtype, max_model_len,
seed, temperature, top_p, max_new_tokens, stop_token_ids, batch_sizes, engine_args (more
keyword arguments for `LLM`), progress (a folder for progress.json, or null), profile (null, or
{dir, steps}: after its timed passes, each engine answers the first two questions again at its
first batch size, untimed, traced by vLLM's torch profiler into dir/NAME for up to `steps` engine
steps, summarised by evaluate/vllm_profile.py), stop_on_error (optional), engines
[{name, drafter, k, method, batch_sizes}] (method: eagle3 unless given, dflash for a DFlash
export; batch_sizes: the request's unless given).
RESULT: vllm_version, complete (false while engines are still to run: the file is written after
each engine), engines {name: {start_seconds, warmup_seconds, profile (or null), passes [{batch_size,
accepts_by, answers [per question [per turn {tokens, seconds, accepts}]], counters {drafts,
draft_tokens, accepted, accepted_per_pos}}]} or {error}}: one engine's failure does not stop the
others, unless the request sets stop_on_error (eval does: its run fails anyway). The log gives each
engine's section a first line of its own (`section_start`).

accepts_by: "turn" where vLLM reports each request's accepted drafts per step (0.27 and later,
`per_request_spec_decode_metrics`); on older releases "call": vLLM's global counters, read
around each generate call, give that call's exact accept histogram (`accepts_from_counters`,
in no particular order), which goes to the call's first turn. At batch 1 that is each turn's own.
"""

from __future__ import annotations

import functools
import gc
import json
import os
import sys
import time
import traceback
from dataclasses import asdict
from pathlib import Path
from typing import Any

COUNTERS = {
    "vllm:spec_decode_num_drafts": "drafts",
    "vllm:spec_decode_num_draft_tokens": "draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "accepted",
    "vllm:spec_decode_num_accepted_tokens_per_pos": "accepted_per_pos",
}


def counters(llm: Any, k: int) -> dict[str, Any]:
    """vLLM's speculative-decoding counters, summed over its engines (0 before the first draft)."""
    out: dict[str, Any] = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "accepted_per_pos": [0] * k}
    for metric in llm.get_metrics():
        name = COUNTERS.get(metric.name)
        if name == "accepted_per_pos":
            out[name] = [a + b for a, b in zip(out[name], metric.values, strict=False)]
        elif name is not None:
            out[name] += int(metric.value)
    return out


def difference(after: dict[str, Any], before: dict[str, Any]) -> dict[str, Any]:
    return {
        k: [a - b for a, b in zip(v, before[k], strict=True)] if isinstance(v, list) else v - before[k]
        for k, v in after.items()
    }


def accepts_from_counters(c: dict[str, Any], k: int) -> list[int]:
    """The drafts accepted at each verification step of a counter difference, as a histogram:
    accepted_per_pos[j] counts the steps whose first j+1 drafts were accepted."""
    reached = [c["drafts"], *c["accepted_per_pos"], 0]  # reached[a]: steps with >= a accepted
    return [a for a in range(k + 1) for _ in range(reached[a] - reached[a + 1])]


def per_request_metrics() -> bool:
    """Whether this vLLM reports accepted drafts per request and step (0.27 and later)."""
    from dataclasses import fields

    from vllm.engine.arg_utils import EngineArgs

    return "per_request_spec_decode_metrics" in {f.name for f in fields(EngineArgs)}


def serve(req: dict[str, Any], engine: dict[str, Any], progress: Any) -> dict[str, Any]:
    """One engine: start it, warm it up, answer every question at every batch size."""
    from vllm import LLM, SamplingParams

    from draftsmith.evaluate.decode import Turn
    from draftsmith.evaluate.questions import Question
    from draftsmith.evaluate.run import answer
    from draftsmith.evaluate.vllm_profile import ENV, profiler_config, summarise
    from draftsmith.target import load_tokenizer

    tok = load_tokenizer(req["tokenizer"], req["chat_template"])
    questions = [Question(**q) for q in req["questions"]]
    k = int(engine["k"])
    by_request = per_request_metrics()
    spec = (
        {
            "speculative_config": {
                "method": engine.get("method") or "eagle3",  # "dflash" for a DFlash export
                "model": engine["drafter"],
                "num_speculative_tokens": k,
            }
            | ({"parallel_drafting": True} if engine.get("parallel_drafting") else {}),  # P-EAGLE
        }
        | ({"per_request_spec_decode_metrics": "detailed"} if by_request else {})
        if engine["drafter"]
        else {}
    )
    trace = Path(req["profile"]["dir"]) / engine["name"] if req.get("profile") else None
    profiling = {"profiler_config": profiler_config(trace, req["profile"]["steps"])} if trace else {}
    if trace:  # before the engine (and, on GPU, its process) starts
        os.environ.update(ENV)
    t0 = time.perf_counter()
    # token ids in and out (the prompts are eval's own, and a GGUF's converted copy has no tokenizer), stopping
    # exactly at eval's stop ids: no tokenizer, and no generation_config.json defaults
    llm = LLM(
        model=req["target"],
        dtype=req["dtype"],
        max_model_len=req["max_model_len"],
        seed=req["seed"],
        skip_tokenizer_init=True,
        generation_config="vllm",
        disable_log_stats=False,
        **spec,
        **profiling,
        **req["engine_args"],
    )
    start_s = time.perf_counter() - t0
    params = SamplingParams(
        temperature=req["temperature"],
        top_p=req["top_p"],
        max_tokens=req["max_new_tokens"],
        seed=req["seed"],
        stop_token_ids=req["stop_token_ids"],
        detokenize=False,
    )

    def generate(prompts: list[list[int]], record: bool = True) -> list[Turn]:
        """One call to vLLM, each row a Turn; `record`: read its accept counts from vLLM's counters
        where needed and advance the progress (not for the profiled pass)."""
        before = counters(llm, k) if record and engine["drafter"] and not by_request else None  # noqa: F821 (called before the del below)
        t = time.perf_counter()
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)  # noqa: F821
        seconds = (time.perf_counter() - t) / len(prompts)  # each row an equal share of its batch's time
        turns = []
        for o in outs:
            done = o.outputs[0]
            metrics = getattr(done, "spec_decode_metrics", None)
            turns.append(
                Turn(list(done.token_ids), seconds, list(metrics.per_step_accepted) if metrics is not None else [])
            )
        if before is not None:  # the call's histogram, on its first turn
            turns[0].accepts = accepts_from_counters(difference(counters(llm, k), before), k)  # noqa: F821
        if record and progress is not None:
            progress.advance(len(turns), tokens=sum(len(t.tokens) for t in turns))
        return turns

    t0 = time.perf_counter()  # warm-up: first-call allocations, as eval's own engine does
    llm.generate(
        [{"prompt_token_ids": [tok.bos_token_id or 0] * 8}],
        SamplingParams(max_tokens=8, detokenize=False),
        use_tqdm=False,
    )
    warmup_s = time.perf_counter() - t0
    if progress is not None:  # this engine's start is not its rate
        progress.ready()
    batch_sizes = engine.get("batch_sizes") or req["batch_sizes"]
    passes = []
    for batch in batch_sizes:
        before = counters(llm, k)
        by_question = answer(tok, questions, [generate], req["completion"], batch)[0]  # [question][turn]
        passes.append(
            {
                "batch_size": batch,
                "accepts_by": "turn" if by_request or batch == 1 else "call",
                "answers": [[asdict(t) for t in turns] for turns in by_question],
                "counters": difference(counters(llm, k), before),
            }
        )
    if trace:  # the first two questions again at the first batch size, traced (unrecorded: the profiler slows them)
        llm.start_profile()
        answer(tok, questions[:2], [functools.partial(generate, record=False)], req["completion"], batch_sizes[0])
        llm.stop_profile()
    del llm
    gc.collect()
    return {
        "start_seconds": round(start_s, 3),
        "warmup_seconds": round(warmup_s, 3),
        "profile": summarise(trace) if trace else None,
        "passes": passes,
    }


ENGINE_MARK = "[draftsmith] vLLM engine"  # what begins the log line that starts each engine's section


def section_start(name: str) -> str:
    """The log line that starts engine `name`'s section (vllm_eval.root_cause reads the log by them)."""
    return f"{ENGINE_MARK} {name}: start"


def main(request: Path, result: Path) -> None:
    import vllm

    from draftsmith.fsutil import atomic_write_json
    from draftsmith.progress import Progress

    req = json.loads(request.read_text())
    turns = sum(len(q["turns"]) for q in req["questions"]) * len(req["batch_sizes"]) * len(req["engines"])
    out: dict[str, Any] = {"vllm_version": vllm.__version__, "engines": {}}
    folder = Path(req["progress"]) if req.get("progress") else None
    with Progress("eval", folder, total=turns, unit="turns", live=False) as progress:
        for engine in req["engines"]:
            print(section_start(engine["name"]), flush=True)
            try:
                out["engines"][engine["name"]] = serve(req, engine, progress)
            except Exception as e:  # vLLM refused it or crashed: the others still run, unless stop_on_error
                traceback.print_exc()
                out["engines"][engine["name"]] = {"error": f"{type(e).__name__}: {e}"}
                if req.get("stop_on_error"):
                    break
            finally:
                gc.collect()
            atomic_write_json(result, {**out, "complete": False})  # what a run stopped from outside keeps
    atomic_write_json(result, {**out, "complete": True})


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
