"""Chat-template tokenization with assistant-only loss masks, derived from the template itself.

    ids, mask = tokenize_conversation(tokenizer, messages)
    pairs = tokenize_conversations(tokenizer, conversations)   # batched, what `prepare` uses

The loss mask is 1 on exactly the tokens the model would generate in each assistant turn: from
the end of the assistant header through the end-of-turn token, when the template has one.
`turn_markers` reads the header and end-of-turn token from three renders once per template;
each conversation is rendered once, its assistant spans found after each header (or, where that
is ambiguous, from prefix renders), and one fast-tokenizer call maps the char spans to tokens
(`Encoding.char_to_token`). How, and which templates it was held against: docs/prepare.md.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from draftsmith.errors import UserError

PROBE_USER, PROBE_REPLY = "Probe question 1234?", "Probe reply 5678."


@dataclass(frozen=True)
class TurnMarkers:
    """What a template puts around an assistant reply."""

    header: str  # generation prompt, e.g. "<|im_start|>assistant\n"; "" when the template has none
    eot: str  # end-of-turn special token text, e.g. "<|im_end|>"; "" when the template has none


NO_TEMPLATE_FIX = (
    "pass one with --chat-template FILE (a Jinja file, e.g. the chat_template.jinja of the "
    "instruct version of this model), or use --completion for a base model (raw text, no template)"
)


def chat_template(tokenizer: Any) -> str:
    """The tokenizer's chat template (the default one of named templates), or a UserError that
    names the two ways on for a model without one."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):  # named templates: the default one renders conversations
        template = template.get("default")
    if not template:
        raise UserError(f"the target's tokenizer has no chat template; {NO_TEMPLATE_FIX}")
    return template


def template_source(tokenizer: Any) -> str:
    """Which chat template a tokenizer renders with, for errors: a --chat-template, or the target's own."""
    return getattr(tokenizer, "template_source", None) or f"the chat template of target {tokenizer.name_or_path}"


def check_template_options(template_file: Path | None, completion: bool) -> None:
    """`--chat-template FILE` must exist, and completion mode (no template) takes none."""
    if template_file is not None and not Path(template_file).is_file():
        raise UserError(f"--chat-template {template_file}: no such file")
    if completion and template_file is not None:
        raise UserError(
            "--completion uses no template; drop --chat-template (or drop --completion to render chats with it)"
        )


def renderer(tokenizer: Any) -> Callable[..., str]:
    """`render(messages, add_generation_prompt=False) -> str` through the tokenizer's chat
    template, rendered by the tokenizer's public `apply_chat_template` (transformers' sandboxed
    Jinja environment, with the special tokens as variables)."""
    template = chat_template(tokenizer)

    def render(messages: list[dict[str, str]], add_generation_prompt: bool = False) -> str:
        try:
            return tokenizer.apply_chat_template(
                messages, chat_template=template, tokenize=False, add_generation_prompt=add_generation_prompt
            )
        except Exception as e:  # a template error (raise_exception, bad role order, a Jinja error)
            raise UserError(
                f"{template_source(tokenizer)} failed on this conversation ({type(e).__name__}: {e}); "
                "fix the conversation, or the template"
            ) from None

    return render


SENTINEL = "@@draftsmith-sentinel-5f1c@@"


def around_message(
    tokenizer: Any, history: list[dict[str, str]], role: str, add_generation_prompt: bool = False
) -> tuple[str, str]:
    """The template's text before and after the content of a `role` message that follows
    `history`: a conversation whose last message is a sentinel, rendered and cut at it."""
    text = renderer(tokenizer)([*history, {"role": role, "content": SENTINEL}], add_generation_prompt)
    i = text.find(SENTINEL)
    if i < 0:
        raise UserError("the target's chat template drops message content; cannot derive its turn markers")
    return text[:i], text[i + len(SENTINEL) :]


def _special_texts(tokenizer: Any) -> set[str]:
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    return set(tokenizer.all_special_tokens) | {t.content for t in added.values() if getattr(t, "special", False)}


def turn_markers(tokenizer: Any, render: Callable[..., str]) -> TurnMarkers:
    """Derive the assistant header and end-of-turn token from the template (see module doc)."""
    user = [{"role": "user", "content": PROBE_USER}]
    try:
        plain, prompted = render(user), render(user, add_generation_prompt=True)
        full = render([*user, {"role": "assistant", "content": PROBE_REPLY}])
    except UserError as e:  # on no record of the data
        raise UserError(
            f"{e} (the conversation: one user turn and one reply that draftsmith renders to find the "
            "template's turn markers)"
        ) from None
    header = ""
    if prompted.startswith(plain) and full.startswith(plain):
        # what the generation prompt and a rendered reply agree on: a prompt that opens a
        # <think> block (DeepSeek-R1) is longer than the header of a rendered turn
        header = os.path.commonprefix([prompted[len(plain) :], full[len(plain) :]])
    after = full[full.find(PROBE_REPLY) + len(PROBE_REPLY) :].lstrip() if PROBE_REPLY in full else ""
    specials = sorted(_special_texts(tokenizer), key=len, reverse=True)
    eot = next((t for t in specials if t and after.startswith(t)), "")
    return TurnMarkers(header=header, eot=eot)


def _answer(content: str) -> str:
    """The part of a reply every template renders verbatim: the text after any </think>."""
    return content.rsplit("</think>", 1)[-1].strip()


def _spans_by_header(text: str, replies: list[str], m: TurnMarkers) -> list[tuple[int, int]] | None:
    """Char spans of the assistant turns in one full render, or None when this way fails."""
    if not m.header or text.count(m.header) != len(replies):
        return None
    spans, pos = [], 0
    for reply in replies:
        start = text.find(m.header, pos) + len(m.header)
        nxt = text.find(m.header, start)
        limit = len(text) if nxt < 0 else nxt
        answer = _answer(reply)
        a = text.find(answer, start, limit)
        if a < 0:
            return None
        end = a + len(answer)
        if m.eot:
            e = text.find(m.eot, end, limit)
            if e < 0 or text[end:e].strip():
                return None
            end = e + len(m.eot)
        spans.append((start, end))
        pos = end
    return spans


def _spans_by_prefix(
    render: Callable[..., str], text: str, messages: list[dict[str, str]], m: TurnMarkers
) -> list[tuple[int, int]]:
    """Char spans from prefix renders: what assistant message i adds to the prompt before it."""
    spans = []
    for i, msg in enumerate(messages):
        if msg["role"] != "assistant":
            continue
        before = render(messages[:i], add_generation_prompt=True)
        upto = render(messages[: i + 1])
        if not (upto.startswith(before) and text.startswith(upto)):
            raise UserError(
                f"cannot locate assistant turn {i} in the chat template's output: the template renders "
                "earlier turns differently once later turns follow; use --chat-template with a template "
                "that renders each turn the same way"
            )
        reply = upto[len(before) :]  # the reply and what the template writes after it
        end = upto.rindex(m.eot) + len(m.eot) if m.eot and m.eot in reply else len(upto.rstrip())
        spans.append((len(before), end))
    return spans


def assistant_spans(
    render: Callable[..., str], text: str, messages: list[dict[str, str]], m: TurnMarkers
) -> list[tuple[int, int]]:
    """Char spans `[start, end)` of every assistant turn in `text` (the render of `messages`)."""
    replies = [msg["content"] for msg in messages if msg["role"] == "assistant"]
    if not replies:
        raise UserError(
            "conversation has no assistant turn, so there is nothing to train on "
            "(for prompts, run `draftsmith synth` first to get the target's answers; "
            "for plain text, prepare with --completion)"
        )
    spans = _spans_by_header(text, replies, m)
    return spans if spans is not None else _spans_by_prefix(render, text, messages, m)


def _token_range(enc: Any, start: int, end: int) -> tuple[int, int]:
    """Tokens whose first char lies in `[start, end)`, as a half-open token index range."""
    a = start
    while a < end and enc.char_to_token(a) is None:
        a += 1
    if a == end:
        return 0, 0
    ta = enc.char_to_token(a)
    if enc.token_to_chars(ta)[0] < start:  # a token straddling the span start belongs before it
        ta += 1
    b = end - 1
    while enc.char_to_token(b) is None:
        b -= 1
    return ta, enc.char_to_token(b) + 1


def encode(tokenizer: Any, texts: list[str], add_special_tokens: bool = False) -> list[Any]:
    """One batched fast-tokenizer call; by default no special tokens are added (templates write
    their own), with `add_special_tokens` the tokenizer's own (a BOS, for raw text)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise UserError("prepare needs a fast (Rust) tokenizer; this target only has a slow one")
    return backend.encode_batch(texts, add_special_tokens=add_special_tokens)


def mask_from_spans(enc: Any, spans: list[tuple[int, int]]) -> np.ndarray:
    """[T] uint8 loss mask from char spans."""
    mask = np.zeros(len(enc), dtype=np.uint8)
    for start, end in spans:
        ta, tb = _token_range(enc, start, end)
        mask[ta:tb] = 1
    return mask


def tokenize_conversations(
    tokenizer: Any,
    conversations: list[list[dict[str, str]]],
    names: list[str] | None = None,
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Batched `tokenize_conversation`: [(input_ids [T] int32, loss_mask [T] uint8), ...]. `names` label
    the conversations in error messages."""
    render = renderer(tokenizer)
    markers = turn_markers(tokenizer, render)
    texts, spans = [], []
    for i, msgs in enumerate(conversations):
        try:
            texts.append(render(msgs))
            spans.append(assistant_spans(render, texts[-1], msgs, markers))
        except UserError as e:
            raise UserError(f"{names[i] if names else f'conversation {i}'}: {e}") from None
    encodings = encode(tokenizer, texts)
    return [(np.array(enc.ids, dtype=np.int32), mask_from_spans(enc, s)) for enc, s in zip(encodings, spans)]


def tokenize_conversation(tokenizer: Any, messages: list[dict[str, str]]) -> tuple[list[int], list[int]]:
    """(input_ids, loss_mask) of one conversation; loss_mask is 1 on assistant tokens."""
    ((ids, mask),) = tokenize_conversations(tokenizer, [messages])
    return ids.tolist(), mask.tolist()
