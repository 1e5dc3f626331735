"""Quality filters for synthesized conversations: prompt de-duplication, thinking-block
stripping, and the checks that drop empty or degenerate generations.

Every check works on text, so the local and the remote backends filter identically. The drop
reasons, in the order they are checked (also the keys of the counts in progress.json): too_long,
empty, loop, no_eot, duplicate.
"""

from __future__ import annotations

import re
from typing import Any

THINK_BLOCK = re.compile(r"<think>.*?</think>\s*", re.DOTALL)


def normalize(text: str) -> str:
    """The form prompts are compared in: whitespace collapsed, case folded."""
    return " ".join(text.split()).casefold()


def prompt_key(messages: list[dict[str, Any]]) -> tuple[str, ...]:
    """A conversation's identity for de-duplication: its system and user turns, normalized."""
    return tuple(normalize(m["content"]) for m in messages if m["role"] in ("system", "user"))


def dedupe(convs: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
    """Keep the first conversation of each distinct prompt key; return (kept, number dropped)."""
    seen: set[tuple[str, ...]] = set()
    kept = []
    for conv in convs:
        key = prompt_key(conv["messages"])
        if key in seen:
            continue
        seen.add(key)
        kept.append(conv)
    return kept, len(convs) - len(kept)


def strip_thinking(text: str) -> str:
    """Remove `<think>...</think>` blocks (and an unterminated one at the end)."""
    text = THINK_BLOCK.sub("", text)
    cut = text.find("<think>")
    return text[:cut].rstrip() if cut >= 0 else text


def repetition_loop(text: str, max_period: int = 200, min_repeats: int = 4, min_span: int = 64) -> bool:
    """True when the text ends in a loop: one block of at most `max_period` characters repeated
    at least `min_repeats` times back to back, covering at least `min_span` characters. A model
    stuck in a loop repeats until it runs out of tokens, so the loop sits at the end."""
    n = len(text)
    for period in range(1, max_period + 1):
        repeats = max(min_repeats, -(-min_span // period))  # ceil(min_span / period)
        span = period * repeats
        if span > n:
            break
        block = text[n - period :]
        if text[n - span :] == block * repeats:
            return True
    return False


def judge(text: str, finished: bool) -> str | None:
    """The drop reason for one generated turn, or None when it is fine to keep.
    `finished`: the turn ended with the template's end-of-turn (not cut by max new tokens)."""
    if not text.strip():
        return "empty"
    if repetition_loop(text.rstrip()):
        return "loop"
    if not finished:
        return "no_eot"
    return None
