"""Batched generation on the static-KV engine (`runtime/engine.py`) for `synth`'s local backend.

The prompts of a batch are left-padded to a common width W, so that every row writes the same
cache slot at every step: the prompts fill slots 0..W-1, new token i goes to slot W+i. Row b
starts at slot pad[b]; its positions are slot - pad[b] and it sees cache slots pad[b]..slot
(a padding slot sees only itself, so that no attention row is empty).

    prefill the batch (eager, in chunks of prompt slots, logits of the last position only)
    -> decode one token per step: a CUDA graph of (1 token, S slots), S = W + max new tokens
       rounded up to a multiple of 64; eager on CPU, same code
    -> choose the next tokens and track finished rows (stop ids) on the device (greedy, or
       temperature / top-k / top-p with a seeded generator); the host looks every CHECK_EVERY steps
    -> with `shrink` (synth --shrink-batches), once half the running rows have finished, the
       batch shrinks: the live rows move to the front of the cache (`TargetEngine.keep_rows`) and
       the steps go on over the first R rows, R the fewest of B, B/2, B/4, ... (down to
       MIN_ROWS) that holds them, each with its own graph, captured the first time a batch of
       that width shrinks to R rows. A batch decodes
       until its longest row stops, and most rows stop well before: Magpie's self-prompted user
       turns used about a quarter of a 1,024-row batch's steps. Greedy tokens are the same either
       way; sampled ones are drawn from the same distribution, but a draw depends on the rows
       beside it. Off by default: it has not yet paid where measured but on a CPU (docs/synth.md).

The engine has a fixed number of rows: a smaller batch is filled with dummy rows, finished from
the start, so that one graph per width bucket serves every batch.

`generate_refilling` (synth --refill-batches) keeps the rows at work instead of shrinking them:
rows whose answers have ended take the next prompts, prefilled beside the running rows in a
scratch cache and placed to end at the slot before the step's, over a cache of REFILL_SPAN
answers' worth of slots.
"""

from __future__ import annotations

import torch

from draftsmith.runtime.engine import TargetEngine
from draftsmith.runtime.sampling import Sampling, exponential_race, target_probs

SLOT_MULTIPLE = 64  # cache widths are rounded up to this, so that batches share graphs
REFILL_SPAN = 4  # a refilling batch's cache: its prompts and this many answers' worth of slots
CHECK_EVERY = 16  # decode steps between host checks of how many rows are still running
MIN_ROWS = 8  # the smallest a batch shrinks to (one graph per halving and cache width)
# The prompts are prefilled in chunks of prompt slots whose mask [B, c, S] holds at most this many
# cells (128 MB of bools), so that a batch of long multi-turn prompts fits (experiments/LOG.md
# 2026-11-30 16:24: the varied mix's synth out of memory).
PREFILL_CELLS = 2**27


def cache_width(prompt_len: int, max_new_tokens: int) -> int:
    """Cache slots a batch of prompts padded to `prompt_len` attends over."""
    return -(-(prompt_len + max_new_tokens) // SLOT_MULTIPLE) * SLOT_MULTIPLE


def left_pad(
    prompts: list[list[int]], width: int, pad_id: int, rows: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompts right-aligned in `rows` (default one per prompt) rows of `width` tokens: ids
    [rows, width] and each row's count of leading pad tokens [rows]. Rows beyond the prompts
    (dummy rows) hold one token, a pad."""
    rows = rows or len(prompts)
    ids = torch.full((rows, width), pad_id, dtype=torch.long)  # [rows, W]
    pad = torch.full((rows,), width - 1, dtype=torch.long)  # [rows]
    for row, p in enumerate(prompts):
        ids[row, width - len(p) :] = torch.tensor(p)
        pad[row] = width - len(p)
    return ids, pad


def row_counts(rows: int) -> list[int]:
    """The row counts a batch of `rows` decodes over as its rows finish: rows, rows/2, ... down
    to MIN_ROWS (or rows alone when it is that small already)."""
    counts = [rows]
    while counts[-1] // 2 >= MIN_ROWS:
        counts.append(counts[-1] // 2)
    return counts


def next_tokens(logits: torch.Tensor, sampling: Sampling, gen: torch.Generator) -> torch.Tensor:
    """logits [B, V] -> token ids [B], on the device without a host sync: the argmax when
    greedy, else a draw from the temperature / top-k / top-p distribution (`target_probs`)."""
    if sampling.temperature == 0:
        return logits.argmax(-1)
    return exponential_race(target_probs(logits, sampling.temperature, sampling.top_p, sampling.top_k), gen)


def prefill(
    engine: TargetEngine, prompts: list[list[int]], pad_id: int, s: int, rows: int | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The prompts, left-padded to the longest (W), into the cache's first `rows` rows (default one
    per prompt; beyond them dummy rows) at slots 0..W-1, eagerly, in chunks of prompt slots (each
    attending over what the earlier ones wrote). Returns the last position's logits [B, 1, V], the
    slots the next token sees [B, S] and each row's leading pads [B] (its first slot)."""
    width = max(map(len, prompts))
    ids, pad = left_pad(prompts, width, pad_id, rows)  # [B, W], [B]
    ids, pad = ids.to(engine.device), pad.to(engine.device)
    rows = ids.shape[0]
    slots = torch.arange(s, device=engine.device)
    chunk = max(1, PREFILL_CELLS // (rows * s))  # prompt slots per prefill chunk
    for a in range(0, width, chunk):
        prompt_slots = slots[a : min(a + chunk, width)]  # [c]
        lo = torch.minimum(pad[:, None], prompt_slots)  # [B, c]: first slot each prompt slot sees
        mask = (slots >= lo[..., None]) & (slots <= prompt_slots[:, None])  # [B, c, S]
        logits, _ = engine.forward_batch(
            ids[:, a : a + chunk], prompt_slots - pad[:, None], prompt_slots, mask, last_only=True
        )  # [B, 1, V]
    return logits, mask[:, -1].clone(), pad


@torch.no_grad()
def generate(
    engine: TargetEngine,
    prompts: list[list[int]],
    sampling: Sampling,
    stop: set[int],
    pad_id: int,
    seed: int,
    shrink: bool = False,
) -> list[list[int]]:
    """The new tokens of each prompt: `sampling.max_new_tokens` of them, or fewer once every
    row has produced a stop id. Rows are not cut at their stop id here (the caller cuts): what
    follows it is the row's next tokens, or `pad_id` once the batch has shrunk without it."""
    rows, dev, max_new = engine.batch, engine.device, sampling.max_new_tokens
    width = max(map(len, prompts))
    s = cache_width(width, max_new)
    if len(prompts) > rows or s > engine.max_len:
        raise ValueError(
            f"a batch of {len(prompts)} prompts x {s} slots does not fit an engine of {rows} x {engine.max_len}"
        )
    counts = row_counts(rows) if shrink else [rows]
    engine.graph(1, s)  # before the prefill: capture writes junk at slot 0
    slots = torch.arange(s, device=dev)
    logits, seen, pad = prefill(engine, prompts, pad_id, s, rows)  # [B, 1, V], [B, S], [B]

    gen = torch.Generator(dev).manual_seed(seed)
    stops = torch.tensor(sorted(stop), dtype=torch.long, device=dev)
    out = torch.full((rows, max_new), pad_id, dtype=torch.long, device=dev)  # [B, N]: running rows first
    order = torch.arange(rows, device=dev)  # [B]: each row of `out` (and of the cache) is prompt order[j]'s
    done = order >= len(prompts)  # [R]; dummy rows are done already
    tok = next_tokens(logits[:, -1], sampling, gen)  # [R]
    r = rows  # the running batch: the cache's first r rows
    for i in range(max_new):
        out[:r, i] = tok
        done |= (tok[:, None] == stops).any(-1)  # [R]
        if i + 1 == max_new:
            break
        if (i + 1) % CHECK_EVERY == 0:
            live = int((~done).sum())  # the host's one look
            if live == 0:
                break
            keep = min(c for c in counts if c >= live)
            if keep < r:  # the live rows first, in their order, then the finished ones
                perm = torch.argsort(done.int(), stable=True)  # [r]
                out[:r], order[:r] = out[:r][perm], order[:r][perm]
                perm = perm[:keep]
                engine.keep_rows(perm)
                tok, pad, seen, done, r = tok[perm], pad[perm], seen[perm], done[perm], keep
                engine.graph(1, s, r, at=width + i)  # its junk goes where this step writes
        slot = width + i
        seen[:, slot] = True
        # ids, pos [R, 1]; slot [1]; mask [R, 1, S]
        logits, _ = engine.forward_batch(tok[:, None], (slot - pad)[:, None], slots[slot : slot + 1], seen[:, None])
        tok = next_tokens(logits[:, -1], sampling, gen)
    by_prompt = torch.empty_like(out)
    by_prompt[order] = out  # [B, N] in the prompts' order
    return by_prompt[: len(prompts), : i + 1].tolist()


def refill_width(prompt_len: int, max_new_tokens: int) -> int:
    """Cache slots a refilling batch (`generate_refilling`) attends over: its longest prompt and
    REFILL_SPAN answers' worth of slots."""
    return cache_width(prompt_len, REFILL_SPAN * max_new_tokens)


@torch.no_grad()
def generate_refilling(
    engine: TargetEngine,
    prompts: list[list[int]],
    sampling: Sampling,
    stop: set[int],
    pad_id: int,
    seed: int,
) -> list[list[int]]:
    """The new tokens of every prompt, in their order (any number of prompts, ideally sorted by
    length; each at most `sampling.max_new_tokens` and not cut at its stop id), with the engine's
    rows kept at work: at every host look (CHECK_EVERY steps) the rows whose answers have ended
    take the next prompts, prefilled in a scratch cache (`TargetEngine.scratch_cache`) and placed
    so that each ends at the slot before the step's. A row's slots stay one contiguous run (what
    flash decoding reads). Once no whole answer fits after the step's slot, the rows run out and
    the next prompts start a new pass at slot 0. Every prompt and its answer must fit the engine's
    max_len; a prompt waits while it is longer than the slots before the step's."""
    rows, dev, max_new, s = engine.batch, engine.device, sampling.max_new_tokens, engine.max_len
    results: list[list[int]] = [[] for _ in prompts]
    queue = list(range(len(prompts)))[::-1]  # the next prompt last
    gen = torch.Generator(dev).manual_seed(seed)
    stops = torch.tensor(sorted(stop), dtype=torch.long, device=dev)
    slots = torch.arange(s, device=dev)
    engine.graph(1, s)  # before any prefill: capture writes junk at slot 0
    while queue:  # one pass from slot 0
        first = [queue.pop() for _ in range(min(rows, len(queue)))]
        width = max(len(prompts[p]) for p in first)
        logits, seen, pad = prefill(engine, [prompts[p] for p in first], pad_id, s, rows)  # [B, 1, V], [B, S], [B]
        owner = first + [-1] * (rows - len(first))  # the prompt each row answers (-1: none)
        end = torch.full((rows,), width, device=dev)  # [B]: the slot of each row's first new token
        out = torch.full((rows, s), pad_id, dtype=torch.long, device=dev)  # [B, S]: the token fed at each slot
        done = torch.arange(rows, device=dev) >= len(first)  # [B]; dummy rows are done already
        tok = next_tokens(logits[:, -1], sampling, gen)  # [B]
        for slot in range(width, s):
            out[:, slot] = tok
            done |= (tok[:, None] == stops).any(-1) | (slot - end + 1 >= max_new)  # [B]
            if (slot + 1 - width) % CHECK_EVERY == 0 or slot + 1 == s:  # the host's look
                ended = [r for r in done.nonzero()[:, 0].tolist() if owner[r] >= 0]
                if ended:  # one copy to the host for all of them
                    for r, row, start in zip(ended, out[ended, : slot + 1].tolist(), end[ended].tolist(), strict=True):
                        results[owner[r]], owner[r] = row[start : start + max_new], -1
                free = [r for r in range(rows) if owner[r] < 0]
                take = []  # the next prompts, while a whole answer fits and each fits before the slot
                while queue and len(take) < len(free) and slot + max_new <= s and len(prompts[queue[-1]]) <= slot:
                    take.append(queue.pop())
                if take:  # each ends at slot - 1; its first new token is fed at the slot
                    new = torch.tensor(free[: len(take)], device=dev)  # [n] rows
                    w = max(len(prompts[p]) for p in take)
                    with engine.scratch_cache(len(take), w) as scratch:
                        new_logits, _, new_pad = prefill(
                            engine, [prompts[p] for p in take], pad_id, w
                        )  # [n, 1, V], [n]
                    engine.place(scratch, new, slot - w)
                    t = next_tokens(new_logits[:, -1], sampling, gen)  # [n]
                    start = slot - w + new_pad  # [n]: each prompt's first slot
                    tok[new], out[new, slot], pad[new], end[new] = t, t, start, slot
                    seen[new] = (slots >= start[:, None]) & (slots < slot)
                    done[new] = (t[:, None] == stops).any(-1) | (max_new <= 1)
                    for r, p in zip(free, take):  # (zip: the first len(take) free rows)
                        owner[r] = p
                if all(o < 0 for o in owner):
                    break
            seen[:, slot] = True
            # ids, pos [B, 1]; slot [1]; mask [B, 1, S]
            logits, _ = engine.forward_batch(tok[:, None], (slot - pad)[:, None], slots[slot : slot + 1], seen[:, None])
            tok = next_tokens(logits[:, -1], sampling, gen)
    return results
