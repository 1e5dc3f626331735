"""The vLLM side of `extract --engine vllm`: a worker process that runs the target in vLLM.

    python -m draftsmith.extract.vllm_worker SPEC.json

`vllm_capture` starts it (vLLM's `LLM` must be built under `__main__`, and never in the process
that writes the store). SPEC names the model folder, dtype, parallelism, the engine's layer ids,
the dataset rows to run and the folder for vLLM's request files. The worker runs vLLM's
`extract_hidden_states` method with the `ExampleHiddenStatesConnector` (on CPU its synchronous
subclass, `vllm_connector`: docs/extract.md): every prompt goes in as token ids with
`max_tokens=1`, and vLLM writes one safetensors file per request (`hidden_states [T, n_slots, H]`,
`token_ids [T]`).

Protocol on stdout: `@@draftsmith {"ready": true}` once the engine is up, then
`@@draftsmith {"row": r, "path": P, "cached": n}` per request (n: prompt
tokens served by the prefix cache), after each chunk of `chunk` requests, then `@@draftsmith
{"done": true}`; other lines are vLLM's log. Chunk k+2 starts only after the parent writes a
line to stdin for chunk k, which bounds the request files on disk to about two chunks.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
from pathlib import Path

MARK = "@@draftsmith "
CPU_CONNECTOR = ("SyncHiddenStatesConnector", "draftsmith.extract.vllm_connector")
GPU_CONNECTOR = ("ExampleHiddenStatesConnector", None)


def emit(record: dict) -> None:
    print(MARK + json.dumps(record), flush=True)


def build_llm(spec: dict):
    from vllm import LLM

    name, module = CPU_CONNECTOR if spec["device"] == "cpu" else GPU_CONNECTOR
    kv_transfer = {
        "kv_connector": name,
        "kv_role": "kv_producer",
        "kv_connector_extra_config": {"shared_storage_path": spec["request_dir"]},
    }
    if module is not None:
        kv_transfer["kv_connector_module_path"] = module
    return LLM(
        model=spec["model"],
        dtype=spec["dtype"],
        skip_tokenizer_init=True,
        seed=0,
        max_model_len=spec["max_model_len"],
        enable_prefix_caching=spec["prefix_caching"],
        tensor_parallel_size=spec["tensor_parallel_size"],
        enable_expert_parallel=spec["expert_parallel"],
        enforce_eager=spec["device"] == "cpu",
        **spec.get("engine_args", {}),
        speculative_config={
            "method": "extract_hidden_states",
            "num_speculative_tokens": 1,
            "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": spec["layer_ids"]}},
        },
        kv_transfer_config=kv_transfer,
    )


def written(path: str) -> bool:
    """Whether the connector has written `path` (it holds the `.lock` exclusively until then)."""
    try:
        with open(path + ".lock") as f:
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except (BlockingIOError, FileNotFoundError):
        return False
    return os.path.exists(path)


def step_until_written(llm, paths: list[str]) -> None:
    """An in-process engine: step it until the connector has written every file in `paths`."""
    while not all(written(p) for p in paths):
        llm.llm_engine.step()


def main(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    if spec["in_process"]:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # read when vLLM builds its engine
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from draftsmith.data.dataset import load_dataset

    ds = load_dataset(Path(spec["dataset"]))
    llm = build_llm(spec)
    emit({"ready": True})
    rows, chunk = spec["rows"], spec["chunk"]
    params = SamplingParams(max_tokens=1, temperature=0.0)
    for k, start in enumerate(range(0, len(rows), chunk)):
        if k >= 2 and not sys.stdin.readline():  # the parent is gone
            return
        part = rows[start : start + chunk]
        prompts = [TokensPrompt(prompt_token_ids=ds.ids[ds.offsets[r] : ds.offsets[r + 1]].tolist()) for r in part]
        outputs = llm.generate(prompts, params, use_tqdm=False)
        paths = [(out.kv_transfer_params or {}).get("hidden_states_path") for out in outputs]
        cached = [int(out.num_cached_tokens or 0) for out in outputs]
        if None in paths:
            raise SystemExit(
                "vLLM returned a request without a hidden_states_path: its KV connector is not the hidden-states one"
            )
        if spec["in_process"]:
            step_until_written(llm, paths)
        for r, path, n in zip(part, paths, cached, strict=True):
            emit({"row": r, "path": path, "cached": n})
    emit({"done": True})


if __name__ == "__main__":
    main(sys.argv[1])
