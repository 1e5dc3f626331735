"""Turn-by-turn synthesis of conversations, independent of the backend.

A `Work` item is one conversation to produce: its kept system and user turns, where a user turn
of None is written by the target itself (Magpie). `synthesize` walks all items of a chunk in
lock-step, turn by turn: first the self-prompted user turns, then the answers, each answer
conditioned on the history regenerated so far. Every backend offers one call,
`generate(requests, sampling) -> generations`, so the local HF backend can batch a whole turn
and the remote backend can keep many requests in flight.

A conversation stops at the first turn that cannot be produced well (too long for the context,
empty, a repetition loop, cut by max new tokens, or a duplicate self-prompt). If it already has
an answered turn it is kept up to there; otherwise it is dropped and counted by reason.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Protocol

from draftsmith.runtime.sampling import Sampling
from draftsmith.synth.filters import judge, normalize, strip_thinking
from draftsmith.synth.magpie import end_of_turn, user_turn_prefix


@dataclass(frozen=True)
class Request:
    """Either answer `messages` as the assistant, or continue the raw text `prefix` (a rendered
    template prefix, for Magpie) until one of `stop`."""

    key: str  # "<conversation id>/<turn>": seeds sampling, names the request in errors
    messages: list[dict[str, str]] | None = None
    prefix: str | None = None
    stop: tuple[str, ...] = ()


@dataclass
class Generation:
    text: str
    tokens: int  # generated tokens, including the end-of-turn token
    finished: bool  # ended with end-of-turn / eos rather than by max new tokens
    too_long: bool = False  # the prompt did not fit the context; nothing was generated


class Backend(Protocol):
    name: str
    capture_seconds: float  # CUDA-graph capture so far, inside the generation time (the local engine's; else 0)
    decoding: str  # how it generates, for synth's log and progress.json (the local engine's levers as they stand)

    def generate(self, requests: list[Request], sampling: Sampling) -> list[Generation]: ...


@dataclass
class Work:
    id: str
    source_id: str
    system: list[dict[str, str]]
    users: list[str | None]  # None: self-prompted (Magpie)
    messages: list[dict[str, str]] = field(default_factory=list)
    tokens: int = 0
    alive: bool = True
    ended: str | None = None  # why the conversation stopped early (a drop reason), if it did
    unfinished: int = 0  # answers kept although --max-new-tokens cut them (--keep-unfinished)
    rejected: str = ""  # the generated text that made it stop, for inspection

    def __post_init__(self) -> None:
        self.messages = list(self.system)

    @property
    def answered(self) -> int:
        return sum(m["role"] == "assistant" for m in self.messages)

    def stop(self, reason: str, rejected: str = "") -> None:
        """End the conversation at its last answered turn."""
        while self.messages and self.messages[-1]["role"] == "user":
            self.messages.pop()
        self.alive, self.ended, self.rejected = False, reason, rejected


def stable_seed(seed: int, key: str) -> int:
    """A 31-bit seed that depends only on the run seed and the request key."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{key}".encode()).digest()[:4], "little") >> 1


def _verdict(gen: Generation, text: str, keep_unfinished: bool) -> str | None:
    return "too_long" if gen.too_long else judge(text, gen.finished or keep_unfinished)


def synthesize(
    backend: Backend,
    works: list[Work],
    sampling: Sampling,
    user_sampling: Sampling,
    tokenizer: Any = None,
    keep_thinking: bool = True,
    keep_unfinished: bool = False,
    seen_users: set[str] | None = None,
) -> list[Work]:
    """Fill in every Work's assistant (and self-prompted user) turns; returns `works`.
    `tokenizer` (for the chat template) is needed only when some user turns are self-prompted;
    `seen_users` collects normalized self-prompts so that duplicates are dropped."""
    seen = seen_users if seen_users is not None else set()
    for turn in range(max((len(w.users) for w in works), default=0)):
        live = [w for w in works if w.alive and turn < len(w.users)]
        magpie = [w for w in live if w.users[turn] is None]
        if magpie:
            stop = (end_of_turn(tokenizer, "user"),)
            requests = [
                Request(f"{w.id}/u{turn}", prefix=user_turn_prefix(tokenizer, w.messages), stop=stop) for w in magpie
            ]
            for w, gen in zip(magpie, backend.generate(requests, user_sampling)):
                w.tokens += gen.tokens
                text = gen.text.strip()
                reason = _verdict(gen, text, keep_unfinished)
                if reason is None and normalize(text) in seen:
                    reason = "duplicate"
                if reason:
                    w.stop(reason, f"[user] {text}")
                    continue
                seen.add(normalize(text))
                w.messages.append({"role": "user", "content": text})
        for w in live:
            if w.alive and w.users[turn] is not None:
                w.messages.append({"role": "user", "content": w.users[turn]})
        live = [w for w in live if w.alive]
        requests = [Request(f"{w.id}/a{turn}", messages=list(w.messages)) for w in live]
        for w, gen in zip(live, backend.generate(requests, sampling)):
            w.tokens += gen.tokens
            text = gen.text if keep_thinking else strip_thinking(gen.text)
            reason = _verdict(gen, text, keep_unfinished)
            if reason:
                w.stop(reason, f"[assistant] {text}")
                continue
            w.messages.append({"role": "assistant", "content": text})
            w.unfinished += not gen.finished
    return works
