"""Question sets for `draftsmith eval`: the bundled MT-bench, or any JSONL file whose lines
have multi-turn `turns` (MT-bench style), a single `prompt` / `question` / `instruction` /
`text`, or OpenAI-style `messages` (the user messages become the turns).

Each question is answered turn by turn: a turn's prompt is the chat template applied to the
earlier user turns, the model's own earlier answers, and the new user turn. In completion mode
(base models) it is those texts concatenated as they are, with the tokenizer's own special
tokens (a BOS) and no template.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from draftsmith.assets import MT_BENCH
from draftsmith.data.chat import chat_template
from draftsmith.data.completion import completion_ids
from draftsmith.errors import UserError
from draftsmith.fsutil import read_jsonl

SINGLE_KEYS = ("prompt", "question", "instruction", "text")


@dataclass
class Question:
    question_id: Any
    category: str
    turns: list[str]


def _turns(record: Any, where: str) -> list[str]:
    if not isinstance(record, dict):
        raise UserError(f"{where}: expected a JSON object with 'turns', 'messages' or one of {SINGLE_KEYS}")
    if "turns" in record:
        turns = record["turns"]
    elif "messages" in record:
        turns = [m.get("content") for m in record["messages"] if isinstance(m, dict) and m.get("role") == "user"]
    else:
        turns = [record[k] for k in SINGLE_KEYS if k in record][:1]
    if not turns or not isinstance(turns, list) or not all(isinstance(t, str) and t.strip() for t in turns):
        raise UserError(
            f"{where}: no usable prompt; give 'turns' (a list of strings), 'messages', or one of {SINGLE_KEYS}"
        )
    return turns


def load_questions(bench: str, limit: int | None = None) -> list[Question]:
    """The first `limit` questions of 'mt_bench' or a JSONL file."""
    path = MT_BENCH if bench == "mt_bench" else Path(bench)
    if bench != "mt_bench" and not path.exists():
        raise UserError(
            f"--bench {bench}: no such file; give 'mt_bench', 'held-out' or a JSONL file of prompts or 'turns'"
        )
    questions = []
    for line, record in read_jsonl(path):
        where = f"{path}:{line}"
        turns = _turns(record, where)
        questions.append(
            Question(record.get("question_id", record.get("id", line)), str(record.get("category", "all")), turns)
        )
        if limit is not None and len(questions) >= limit:
            break
    if not questions:
        raise UserError(f"{path}: no questions found")
    return questions


def turn_prompt(tokenizer: Any, turns: list[str], answers: list[str], completion: bool = False) -> list[int]:
    """Token ids of the chat so far (user turns and the model's answers) plus the next user
    turn, ending with the generation prompt; with `completion`, of those texts concatenated,
    no template."""
    messages: list[dict[str, str]] = []
    for i, user in enumerate(turns):
        messages.append({"role": "user", "content": user})
        if i < len(answers):
            messages.append({"role": "assistant", "content": answers[i]})
    if completion:
        return completion_ids(tokenizer, messages)
    ids = tokenizer.apply_chat_template(
        messages, chat_template=chat_template(tokenizer), add_generation_prompt=True, tokenize=True
    )
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):  # BatchEncoding in newer transformers
        ids = ids["input_ids"]
    return list(ids)


def token_bound(tokenizer: Any, question: Question, max_new_tokens: int, completion: bool = False) -> int:
    """An upper bound on the tokens a whole question needs (prompts, answers, templates)."""
    prompt = turn_prompt(tokenizer, question.turns, [""] * (len(question.turns) - 1), completion)
    return len(prompt) + len(question.turns) * (max_new_tokens + 16)
