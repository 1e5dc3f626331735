"""Local backend: the HF target generates in batches on CPU or GPU.

Requests are tokenized (chat requests through the target's chat template), sorted by length
and cut into batches, so that a batch wastes little padding; each batch is left-padded and goes
through HF `generate` with its KV cache. With `cache="static"` the cache is preallocated and
prompt lengths are padded to a multiple of 64, which keeps shapes static (what a compiled
decode step needs on GPU). A generation ends at the chat template's end-of-turn token or the
model's eos; the text is decoded up to it.

Greedy decoding of a batch gives the same tokens as the target's own `generate` on each prompt
alone, up to floating-point differences that padding can cause (see docs/synth.md).
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from draftsmith.synth.magpie import end_of_turn
from draftsmith.synth.turns import Generation, Request, Sampling, stable_seed
from draftsmith.target import Target, text_config

STATIC_MULTIPLE = 64


def _ids(value: Any) -> set[int]:
    if value is None:
        return set()
    return {int(v) for v in value} if isinstance(value, (list, tuple)) else {int(value)}


def stop_token_ids(target: Target) -> set[int]:
    """End-of-turn and eos ids: the template's end-of-turn token, the tokenizer's eos and the
    model's generation-config eos (which may be a list)."""
    tok = target.tokenizer
    ids = _ids(tok.eos_token_id) | _ids(getattr(target.model.generation_config, "eos_token_id", None))
    for role in ("assistant", "user"):
        eot = tok.convert_tokens_to_ids(end_of_turn(tok, role))
        if isinstance(eot, int) and eot != tok.unk_token_id:
            ids.add(eot)
    return ids


def context_length(target: Target) -> int:
    tc = text_config(target.model.config)
    return int(getattr(tc, "max_position_embeddings", None) or 1 << 30)


def _generation_config(target: Target, sampling: Sampling, stop: set[int], pad: int, cache: str) -> Any:
    """The model's own generation config with our sampling and stopping settings on top."""
    cfg = copy.deepcopy(target.model.generation_config)
    cfg.max_new_tokens = sampling.max_new_tokens
    cfg.max_length = None
    cfg.do_sample = sampling.temperature > 0
    if cfg.do_sample:
        cfg.temperature, cfg.top_p, cfg.top_k = sampling.temperature, sampling.top_p, sampling.top_k
    else:
        cfg.temperature, cfg.top_p, cfg.top_k = None, None, None
    cfg.eos_token_id = sorted(stop)
    cfg.pad_token_id = pad
    cfg.cache_implementation = "static" if cache == "static" else None
    return cfg


class LocalBackend:
    """Batched generation with an HF target (`draftsmith.target.load_target`)."""

    def __init__(self, target: Target, batch_size: int = 32, cache: str = "dynamic") -> None:
        self.target, self.batch_size, self.cache = target, batch_size, cache
        self.name = target.info.name
        self.tokenizer = target.tokenizer
        self.stop = stop_token_ids(target)
        self.context = context_length(target)
        self.pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else min(self.stop)

    def encode(self, request: Request) -> list[int]:
        """Token ids of the prompt: the raw prefix, or the chat rendered for an assistant reply."""
        text = request.prefix
        if text is None:
            text = self.tokenizer.apply_chat_template(request.messages, tokenize=False, add_generation_prompt=True)
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def generate(self, requests: list[Request], sampling: Sampling) -> list[Generation]:
        prompts = [self.encode(r) for r in requests]
        results: list[Generation | None] = [None] * len(requests)
        fits = []
        for i, ids in enumerate(prompts):
            if len(ids) + sampling.max_new_tokens > self.context:
                results[i] = Generation("", 0, finished=False, too_long=True)
            else:
                fits.append(i)
        fits.sort(key=lambda i: len(prompts[i]))
        for start in range(0, len(fits), self.batch_size):
            batch = fits[start:start + self.batch_size]
            stop = set(self.stop)
            for i in batch:
                ids = self.tokenizer.convert_tokens_to_ids(list(requests[i].stop))
                stop |= {t for t in ids if t not in (None, self.tokenizer.unk_token_id)}
            seed = stable_seed(sampling.seed, requests[batch[0]].key)
            for i, gen in zip(batch, self._batch([prompts[i] for i in batch], sampling, stop, seed)):
                results[i] = gen
        return results  # type: ignore[return-value]

    @torch.inference_mode()
    def _batch(self, prompts: list[list[int]], sampling: Sampling, stop: set[int], seed: int) -> list[Generation]:
        width = max(len(p) for p in prompts)
        if self.cache == "static":  # round up, within what the context leaves after the new tokens
            width = max(width, min(-(-width // STATIC_MULTIPLE) * STATIC_MULTIPLE, self.context - sampling.max_new_tokens))
        device = self.target.device
        input_ids = torch.full((len(prompts), width), self.pad, dtype=torch.long)  # [b, s], left-padded
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, ids in enumerate(prompts):
            input_ids[row, width - len(ids):] = torch.tensor(ids)
            mask[row, width - len(ids):] = 1
        torch.manual_seed(seed)
        out = self.target.model.generate(
            input_ids=input_ids.to(device), attention_mask=mask.to(device),
            generation_config=_generation_config(self.target, sampling, stop, self.pad, self.cache),
        )
        new = out[:, width:].tolist()  # [b, <= max_new_tokens]
        gens = []
        for tokens in new:
            cut = next((j for j, t in enumerate(tokens) if t in stop), None)
            body = tokens if cut is None else tokens[:cut]
            text = self.tokenizer.decode(body, skip_special_tokens=True)
            gens.append(Generation(text, len(body) + (cut is not None), finished=cut is not None))
        return gens
