"""What Magpie-style self-prompting needs from a chat template, derived from the template itself.

Magpie feeds the model the template's text up to where a user message would start; an
instruction-tuned model then writes a plausible user message and closes the turn. Nothing here
is model-specific: the user-turn prefix comes from rendering a conversation whose last user
message is a sentinel and cutting at the sentinel, and the end-of-turn marker is the special
token the template puts right after a message's content.
"""

from __future__ import annotations

from typing import Any

from draftsmith.data.chat import around_message
from draftsmith.errors import UserError


def user_turn_prefix(tokenizer: Any, history: list[dict[str, str]]) -> str:
    """The rendered text of `history` followed by the opening of a new user turn: the prompt a
    model completes to write the next user message (the template's default system prompt, if
    it has one, is included as the template renders it)."""
    return around_message(tokenizer, history, "user")[0]


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
    after = around_message(tokenizer, history, role)[1].lstrip(" ")
    for name in special_tokens(tokenizer):
        if after.startswith(name):
            return name
    if tokenizer.eos_token:
        return str(tokenizer.eos_token)
    raise UserError("cannot find the end-of-turn marker of the target's chat template")
