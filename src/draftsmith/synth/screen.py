"""Screening prompts for a mix: length and script filters, exact and near-duplicate removal.

    screen = Screen(min_chars=16, max_chars=6000, scripts={"latin"}, near=0.8)
    reason = screen.check(messages)   # None, or why the prompt is dropped
    screen.add(messages)              # count it as taken: later copies are duplicates

Length counts the characters of the system and user turns. Script is the Unicode script of most
letters in the user turns (`latin`, `cyrillic`, `han`, ...; `none` without letters), a cheap,
deterministic stand-in for language identification (`scripts` keeps, `exclude_scripts` drops).
Exact duplicates share the normalized system and user turns (`filters.prompt_key`), compared as
a 16-byte hash. Near duplicates have a Jaccard similarity of at least `near` between the sets of
word 3-grams of their user turns (many tasks share a long system turn). Candidates come from
MinHash LSH (64 hashes in 16 bands of 4: a pair at 0.8 is missed with probability about 2e-4),
each confirmed on the exact sets. Hashes are crc32 and fixed constants, so a rerun takes the
same decisions.
"""

from __future__ import annotations

import hashlib
import unicodedata
import zlib
from collections import Counter
from functools import lru_cache
from typing import Any

import numpy as np

from draftsmith.synth.filters import normalize, prompt_key

SCRIPT_NAMES = {"CJK": "han", "HIRAGANA": "kana", "KATAKANA": "kana"}
SCRIPTS_HELP = "latin, cyrillic, greek, arabic, hebrew, han, kana, hangul, devanagari, thai, ... (none: no letters)"
N_HASH, BANDS = 64, 16
PRIME = (1 << 31) - 1  # a*x + b stays below 2**64 for x < 2**32
_rng = np.random.RandomState(20240917)
HASH_A = _rng.randint(1, PRIME, N_HASH).astype(np.uint64)
HASH_B = _rng.randint(0, PRIME, N_HASH).astype(np.uint64)


@lru_cache(maxsize=1 << 16)
def char_script(ch: str) -> str:
    words = unicodedata.name(ch, "").split(" ")
    word = words[1] if words[0] in ("HALFWIDTH", "FULLWIDTH") and len(words) > 1 else words[0]
    return SCRIPT_NAMES.get(word, word.lower() or "other")


def script_of(text: str, sample: int = 2000) -> str:
    """The script of most letters in `text` (the first `sample` letters are looked at)."""
    if text.isascii():
        return "latin" if any(c.isalpha() for c in text) else "none"
    counts: Counter[str] = Counter()
    seen = 0
    for ch in text:
        if ch.isalpha():
            counts[char_script(ch)] += 1
            seen += 1
            if seen >= sample:
                break
    return counts.most_common(1)[0][0] if counts else "none"


def exact_key(messages: list[dict[str, Any]]) -> bytes:
    return hashlib.blake2b("\x00".join(prompt_key(messages)).encode(), digest_size=16).digest()


def shingles(text: str, n: int = 3) -> frozenset[int]:
    """crc32 hashes of the word n-grams of the normalized text (the whole text when shorter)."""
    words = normalize(text).split()
    grams = [" ".join(words[i : i + n]) for i in range(max(len(words) - n + 1, 1))]
    return frozenset(zlib.crc32(g.encode()) for g in grams)


def minhash(items: frozenset[int]) -> np.ndarray:
    x = np.fromiter(items, dtype=np.uint64, count=len(items))[:, None]  # [n, 1]
    return ((HASH_A[None, :] * x + HASH_B[None, :]) % PRIME).min(axis=0)  # [N_HASH]


def jaccard(a: frozenset[int], b: frozenset[int]) -> float:
    return len(a & b) / len(a | b) if a or b else 1.0


class NearDuplicates:
    """MinHash LSH over the prompts taken so far; `find` confirms on the exact shingle sets."""

    def __init__(self, threshold: float) -> None:
        self.threshold = threshold
        self.sets: list[frozenset[int]] = []
        self.buckets: list[dict[bytes, list[int]]] = [{} for _ in range(BANDS)]

    def _bands(self, items: frozenset[int]) -> list[bytes]:
        sig = minhash(items)
        rows = N_HASH // BANDS
        return [sig[b * rows : (b + 1) * rows].tobytes() for b in range(BANDS)]

    def find(self, items: frozenset[int]) -> bool:
        seen: set[int] = set()
        for band, key in enumerate(self._bands(items)):
            for j in self.buckets[band].get(key, ()):
                if j not in seen:
                    seen.add(j)
                    if jaccard(items, self.sets[j]) >= self.threshold:
                        return True
        return False

    def add(self, items: frozenset[int]) -> None:
        j = len(self.sets)
        self.sets.append(items)
        for band, key in enumerate(self._bands(items)):
            self.buckets[band].setdefault(key, []).append(j)


class Screen:
    """The filters and duplicate checks of one mix, shared by all its sources, so a prompt taken
    from one source makes its copies in later sources duplicates."""

    def __init__(
        self,
        min_chars: int = 1,
        max_chars: int | None = None,
        scripts: set[str] | None = None,
        exclude_scripts: set[str] | None = None,
        exact: bool = True,
        near: float | None = None,
    ) -> None:
        self.min_chars, self.max_chars = min_chars, max_chars
        self.scripts, self.exclude_scripts = scripts, exclude_scripts or set()
        self.exact = exact
        self.seen: set[bytes] = set()
        self.near = NearDuplicates(near) if near is not None else None

    def check(self, messages: list[dict[str, Any]]) -> str | None:
        """Why this prompt is dropped (`no_user_turn`, `too_short`, `too_long`, `script`,
        `duplicate`, `near_duplicate`), or None to take it."""
        users = "\n".join(m["content"] for m in messages if m["role"] == "user")
        if not users.strip():
            return "no_user_turn"
        size = sum(len(m["content"]) for m in messages if m["role"] in ("system", "user"))
        if size < self.min_chars:
            return "too_short"
        if self.max_chars is not None and size > self.max_chars:
            return "too_long"
        if self.scripts is not None or self.exclude_scripts:
            script = script_of(users)
            if (self.scripts is not None and script not in self.scripts) or script in self.exclude_scripts:
                return "script"
        if self.exact and exact_key(messages) in self.seen:
            return "duplicate"
        if self.near is not None and self.near.find(shingles(users)):
            return "near_duplicate"
        return None

    def add(self, messages: list[dict[str, Any]]) -> None:
        if self.exact:
            self.seen.add(exact_key(messages))
        if self.near is not None:
            self.near.add(shingles("\n".join(m["content"] for m in messages if m["role"] == "user")))
