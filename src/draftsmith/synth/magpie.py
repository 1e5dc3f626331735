"""What Magpie-style self-prompting needs from a chat template, derived from the template itself.

Magpie feeds the model the template's text up to where a user message would start; an
instruction-tuned model then writes a plausible user message and closes the turn. Nothing here
is model-specific: the user-turn prefix comes from rendering a conversation whose last user
message is a sentinel and cutting at the sentinel, and the end-of-turn marker is the special
token the template puts right after a message's content.
"""

from __future__ import annotations

from typing import Any

from draftsmith.data.chat import chat_template
from draftsmith.errors import UserError

SENTINEL = "@@draftsmith-sentinel-5f1c@@"


def _render(tokenizer: Any, messages: list[dict[str, str]]) -> str:
    return tokenizer.apply_chat_template(messages, chat_template=chat_template(tokenizer), tokenize=False,
                                         add_generation_prompt=False)


def _split_at_sentinel(tokenizer: Any, messages: list[dict[str, str]]) -> tuple[str, str]:
    text = _render(tokenizer, messages)
    i = text.find(SENTINEL)
    if i < 0:
        raise UserError("the target's chat template drops message content; cannot derive its turn markers")
    return text[:i], text[i + len(SENTINEL):]


def user_turn_prefix(tokenizer: Any, history: list[dict[str, str]]) -> str:
    """The rendered text of `history` followed by the opening of a new user turn: the prompt a
    model completes to write the next user message (the template's default system prompt, if
    it has one, is included as the template renders it)."""
    prefix, _ = _split_at_sentinel(tokenizer, [*history, {"role": "user", "content": SENTINEL}])
    return prefix


def special_tokens(tokenizer: Any) -> list[str]:
    """Every special token's text, longest first (so `<|im_end|>` beats `<|im`)."""
    names = set(getattr(tokenizer, "all_special_tokens", []))
    for added in getattr(tokenizer, "added_tokens_decoder", {}).values():
        if getattr(added, "special", False):
            names.add(str(added.content))
    return sorted((n for n in names if n), key=len, reverse=True)


def end_of_turn(tokenizer: Any, role: str = "user") -> str:
    """The marker that closes a `role` message in this template (`<|im_end|>`, `<|eot_id|>`...):
    the special token right after the message content, else the template's eos token."""
    history = [{"role": "user", "content": "Hi."}] if role == "assistant" else []
    _, after = _split_at_sentinel(tokenizer, [*history, {"role": role, "content": SENTINEL}])
    after = after.lstrip(" ")
    for name in special_tokens(tokenizer):
        if after.startswith(name):
            return name
    if tokenizer.eos_token:
        return str(tokenizer.eos_token)
    raise UserError("cannot find the end-of-turn marker of the target's chat template")
