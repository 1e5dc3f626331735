"""vLLM backend (`synth --generator vllm`): the target answers through vLLM's offline engine.

The prompts are the local backend's own token ids (synth/local.py: `encode`, the same chat
template, the same stop ids, the same cut at the first stop id), so a conversation differs from
the local backend's only where the two engines' kernels round differently. vLLM runs in this
process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`: no engine process to spawn, which a CLI without a
`__main__` guard cannot), schedules up to --batch-size sequences at once and keeps a KV cache
sized for them (vllm_support.kv_cache_bytes), not vLLM's default share of the GPU. One engine
per target and settings is kept for the process, so a pipeline's synth stages start it once.
Each request has its own seed (`stable_seed`), so a resumed run samples what it would have.
"""

from __future__ import annotations

import os
from typing import Any

from draftsmith.errors import UserError
from draftsmith.runtime.sampling import Sampling
from draftsmith.synth.local import encode, generation, request_stops, stop_ids
from draftsmith.synth.turns import Generation, Request, stable_seed
from draftsmith.target import generation_eos, hf_folder, load_text_config, load_tokenizer
from draftsmith.vllm_support import kv_cache_bytes, require, vllm_dtype

PROMPT_ROOM = 1024  # prompt tokens per sequence the KV cache is sized for, beside the answer's
_ENGINES: dict[tuple, Any] = {}  # (target, dtype, batch, max_len) -> vLLM's LLM, kept for the process


def engine(spec: str, text_config: Any, dtype: str, batch: int, max_new_tokens: int, on_gpu: bool) -> Any:
    """vLLM's LLM for this target, started once per process and settings. No seed in the key:
    every request carries its own, so synth stages with other seeds share the engine (a second
    engine beside the first failed vLLM's start-up memory check on the H200, 2026-12-05)."""
    context = int(getattr(text_config, "max_position_embeddings", None) or 8192)
    max_len = min(context, PROMPT_ROOM + max_new_tokens + 64)
    key = (spec, dtype, batch, max_len)
    if key not in _ENGINES:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # read when vLLM builds its engine
        from vllm import LLM

        kv = kv_cache_bytes(text_config, 4 if dtype == "float32" else 2, batch, max_len)
        cpu = {} if on_gpu else {"enforce_eager": True, "distributed_executor_backend": "uni"}
        _ENGINES[key] = LLM(
            model=str(hf_folder(spec, "synth --generator vllm")),
            dtype=dtype,
            max_model_len=max_len,
            max_num_seqs=batch,
            kv_cache_memory_bytes=kv,
            skip_tokenizer_init=True,  # token ids in and out: the local backend's prompts, cut our own way
            generation_config="vllm",  # our sampling settings, not generation_config.json's defaults
            **cpu,
        )
    return _ENGINES[key]


class VllmBackend:
    """Generation with the target served by vLLM's offline engine."""

    capture_seconds = 0.0  # vLLM captures its graphs when its engine starts, before any generation
    decoding = "vLLM's offline engine"

    def __init__(self, spec: str, chat_template: Any, batch_size: int, dtype: str | None, completion: bool) -> None:
        require("synth --generator vllm", "--generator auto (draftsmith's own engine)")
        import torch

        self.on_gpu = torch.cuda.is_available()
        self.spec, self.batch_size, self.completion = spec, batch_size, completion
        self.dtype = vllm_dtype(dtype, self.on_gpu)
        self.tokenizer = load_tokenizer(spec, chat_template)
        self.name = spec
        self.text_config = load_text_config(spec)
        self.stop = stop_ids(self.tokenizer, generation_eos(spec, self.text_config), completion)
        self.context = int(getattr(self.text_config, "max_position_embeddings", None) or 1 << 30)

    def generate(self, requests: list[Request], sampling: Sampling) -> list[Generation]:
        from vllm import SamplingParams

        llm = engine(self.spec, self.text_config, self.dtype, self.batch_size, sampling.max_new_tokens, self.on_gpu)
        max_len = llm.llm_engine.model_config.max_model_len
        prompts = [encode(self.tokenizer, r, self.completion) for r in requests]
        results: list[Generation | None] = [None] * len(requests)
        todo, params, stops = [], [], []
        for i, (r, ids) in enumerate(zip(requests, prompts)):
            if len(ids) + sampling.max_new_tokens > min(self.context, max_len):
                if len(ids) + sampling.max_new_tokens <= self.context:  # fits the model, not this engine
                    raise UserError(
                        f"synth --generator vllm: a prompt of {len(ids)} tokens does not fit the engine's "
                        f"{max_len} tokens; use --generator auto for such long prompts"
                    )
                results[i] = Generation("", 0, finished=False, too_long=True)
                continue
            stop = request_stops(self.tokenizer, r, self.stop)
            todo.append(i)
            stops.append(stop)
            params.append(
                SamplingParams(
                    temperature=sampling.temperature,
                    top_p=sampling.top_p if sampling.temperature > 0 else 1.0,
                    top_k=sampling.top_k if sampling.temperature > 0 and sampling.top_k else -1,
                    max_tokens=sampling.max_new_tokens,
                    seed=stable_seed(sampling.seed, r.key),
                    stop_token_ids=sorted(stop),
                    detokenize=False,
                )
            )
        if todo:
            outs = llm.generate([{"prompt_token_ids": prompts[i]} for i in todo], params, use_tqdm=False)
            for i, out, stop in zip(todo, outs, stops):
                results[i] = generation(self.tokenizer, list(out.outputs[0].token_ids), stop)
        return results  # type: ignore[return-value]
