"""Template-free tokenization for base models: `prepare --completion`.

    pairs = tokenize_completions(tokenizer, conversations)   # [(input_ids [T], loss_mask [T]), ...]
    ids = completion_ids(tokenizer, messages)                # a prompt: eval and synth --completion

A record is plain text (a `text` or `prompt` field alone: read as one user message) or one
prompt/completion pair (read as a user and an assistant message). The model sees
`prompt + completion` exactly as given: no template, no separator, with the special tokens the
tokenizer itself adds to raw text (a BOS for most base models), as `eval --completion` feeds
its prompts. The loss mask covers the completion's tokens; plain text is a completion with an
empty prompt, so all of it. A token that straddles the prompt/completion boundary counts as
prompt (chat.py's span rules).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from draftsmith.data.chat import encode, mask_from_spans
from draftsmith.errors import UserError


def completion_parts(messages: list[dict[str, str]], where: str) -> tuple[str, str]:
    """(prompt, completion) of one normalised record: plain text or a prompt/completion pair."""
    roles = [m["role"] for m in messages]
    if roles == ["user"]:
        return "", messages[0]["content"]
    if roles == ["user", "assistant"]:
        return messages[0]["content"], messages[1]["content"]
    raise UserError(
        f"{where}: --completion takes plain text or one prompt/completion pair per record, not a "
        f"conversation with the turns {roles}; prepare conversations without --completion "
        "(a base model then needs --chat-template FILE)"
    )


def tokenize_completions(
    tokenizer: Any, conversations: list[list[dict[str, str]]], names: list[str]
) -> list[tuple[np.ndarray, np.ndarray]]:
    """[(input_ids [T] int32, loss_mask [T] uint8), ...]: one batched tokenizer call over
    prompt + completion, the mask 1 on the completion's tokens. `names` label the records in
    error messages."""
    parts = [completion_parts(msgs, name) for msgs, name in zip(conversations, names, strict=True)]
    encodings = encode(tokenizer, [p + c for p, c in parts], add_special_tokens=True)
    return [
        (np.array(enc.ids, dtype=np.int32), mask_from_spans(enc, [(len(p), len(p) + len(c))]))
        for enc, (p, c) in zip(encodings, parts)
    ]


def completion_ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """Token ids of a raw-text prompt: the messages' texts concatenated as they are, with the
    special tokens the tokenizer adds to raw text (what `tokenize_completions` gives a prompt)."""
    return list(tokenizer("".join(m["content"] for m in messages))["input_ids"])
