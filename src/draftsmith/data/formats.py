"""Reading conversations in the common formats, normalised to one shape.

    read_conversations(path, fmt="auto") -> [{"id": str, "messages": [{"role", "content"}, ...]}, ...]

Roles are always "system", "user" or "assistant". The record formats (`sharegpt`, `messages`,
`pairs`, `turns`, `prompts`) and the containers (a JSONL file, a JSON list, a parquet or arrow
file, a saved Hugging Face dataset or a folder of parquet/jsonl files; `fmt="hf"` insists on a
folder) are tabled in docs/prepare.md. With "auto" the format is detected from the first
record; every record must then have that format. Ids come from an `id`, `question_id` or
`conversation_id` field, else from the position (`line-N` for JSON lines, `row-N` for tables),
so they are stable across runs. Every problem is a UserError naming the file and line (or row)
and what to do.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from draftsmith.errors import UserError
from draftsmith.fsutil import json_line

RECORD_FORMATS = ("sharegpt", "messages", "pairs", "turns", "prompts")
FORMATS = ("auto", *RECORD_FORMATS, "hf")
ROLES = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "human": "user",
    "assistant": "assistant",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "bard": "assistant",
    "bing": "assistant",
    "model": "assistant",
    "bot": "assistant",
}
# (prompt key, response key), tried in this order
PAIR_KEYS = (
    ("prompt", "response"),
    ("prompt", "completion"),
    ("question", "answer"),
    ("instruction", "output"),
    ("input", "output"),
    ("query", "response"),
)
PROMPT_KEYS = ("prompt", "text", "instruction", "question")
ID_KEYS = ("id", "question_id", "conversation_id")


def detect_format(record: Any, where: str) -> str:
    """The record format of one record, from its keys."""
    if not isinstance(record, dict):
        raise UserError(f"{where}: expected a JSON object per record, got {type(record).__name__}")
    if "conversations" in record:
        return "sharegpt"
    if "messages" in record:
        return "messages"
    if "turns" in record:
        return "turns"
    if any(p in record and r in record for p, r in PAIR_KEYS):
        return "pairs"
    if any(k in record for k in PROMPT_KEYS):
        return "prompts"
    raise UserError(
        f"{where}: unknown conversation format (keys: {sorted(record)[:8]}). Expected one of: "
        "'conversations' (ShareGPT), 'messages' (OpenAI), prompt/response or question/answer pairs, "
        "'turns' (MT-bench), or 'prompt'/'text' (plain prompts); or pass --format"
    )


def _text(value: Any, where: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(p, dict) for p in value):  # OpenAI content parts
        return "".join(p.get("text", "") for p in value if p.get("type", "text") == "text")
    raise UserError(f"{where}: message content must be a string, got {type(value).__name__}")


def _message(role: Any, content: Any, where: str) -> dict[str, str]:
    norm = ROLES.get(str(role).lower()) if isinstance(role, str) else None
    if norm is None:
        raise UserError(f"{where}: unknown role {role!r}; expected one of {sorted(set(ROLES))}")
    return {"role": norm, "content": _text(content, where)}


def _list_field(record: dict, key: str, where: str) -> list:
    value = record.get(key)
    if value is None:
        raise UserError(
            f"{where}: no '{key}' field; all records must have the format of the first one (or pass --format)"
        )
    if not isinstance(value, list):
        raise UserError(f"{where}: '{key}' must be a list, got {type(value).__name__}")
    return value


def _system(record: dict, where: str) -> list[dict[str, str]]:
    system = record.get("system")
    return [{"role": "system", "content": _text(system, where)}] if system else []


def _sharegpt(record: dict, where: str) -> list[dict[str, str]]:
    out = _system(record, where)
    for turn in _list_field(record, "conversations", where):
        if not isinstance(turn, dict):
            raise UserError(f"{where}: each entry of 'conversations' must be an object with from/value")
        out.append(_message(turn.get("from", turn.get("role")), turn.get("value", turn.get("content")), where))
    return out


def _messages(record: dict, where: str) -> list[dict[str, str]]:
    out = []
    for turn in _list_field(record, "messages", where):
        if not isinstance(turn, dict):
            raise UserError(f"{where}: each entry of 'messages' must be an object with role/content")
        out.append(_message(turn.get("role"), turn.get("content"), where))
    return out


def _pairs(record: dict, where: str) -> list[dict[str, str]]:
    for p, r in PAIR_KEYS:
        if p in record and r in record:
            prompt = _text(record[p], where)
            if p == "instruction" and record.get("input"):  # Alpaca style
                prompt = f"{prompt}\n\n{_text(record['input'], where)}"
            return [
                *_system(record, where),
                {"role": "user", "content": prompt},
                {"role": "assistant", "content": _text(record[r], where)},
            ]
    raise UserError(f"{where}: not a prompt/response pair (expected one of {[f'{p}/{r}' for p, r in PAIR_KEYS]})")


def _turns(record: dict, where: str) -> list[dict[str, str]]:
    return [
        *_system(record, where),
        *({"role": "user", "content": _text(t, where)} for t in _list_field(record, "turns", where)),
    ]


def _prompts(record: dict, where: str) -> list[dict[str, str]]:
    for k in PROMPT_KEYS:
        if k in record:
            return [*_system(record, where), {"role": "user", "content": _text(record[k], where)}]
    raise UserError(f"{where}: no prompt field (expected one of {list(PROMPT_KEYS)})")


PARSERS: dict[str, Callable[[dict, str], list[dict[str, str]]]] = {
    "sharegpt": _sharegpt,
    "messages": _messages,
    "pairs": _pairs,
    "turns": _turns,
    "prompts": _prompts,
}


# --- containers: yield (where, position id, record) ------------------------------------------


def _jsonl(path: Path) -> Iterator[tuple[str, str, Any]]:
    with path.open("rb") as f:
        for i, raw in enumerate(f, start=1):
            if raw.strip():
                yield f"{path}:{i}", f"line-{i}", json_line(path, i, raw)


def _json(path: Path) -> Iterator[tuple[str, str, Any]]:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: not UTF-8 text (byte {e.start}); give a JSON file saved as UTF-8") from None
    if not text.lstrip().startswith("["):
        yield from _jsonl(path)  # JSON lines saved as .json
        return
    try:
        records = json.loads(text)
    except json.JSONDecodeError as e:
        raise UserError(f"{path}:{e.lineno}: malformed JSON ({e.msg} at column {e.colno})") from None
    except RecursionError:
        raise UserError(f"{path}: JSON nested too deeply to read; fix the file") from None
    for i, record in enumerate(records):
        yield f"{path}[{i}]", f"row-{i}", record


def _read_arrow(path: Path) -> Any:
    import pyarrow as pa

    try:
        with pa.memory_map(str(path)) as src:
            return pa.ipc.open_stream(src).read_all()  # what `datasets.save_to_disk` writes
    except pa.ArrowInvalid:
        with pa.memory_map(str(path)) as src:
            return pa.ipc.open_file(src).read_all()


def _table_files(folder: Path) -> list[Path]:
    if (folder / "dataset_dict.json").exists():  # a DatasetDict: use its train split
        splits = json.loads((folder / "dataset_dict.json").read_text()).get("splits", [])
        if "train" not in splits and len(splits) != 1:
            raise UserError(f"{folder}: a dataset with splits {splits} and no 'train'; point at one split's folder")
        return _table_files(folder / ("train" if "train" in splits else splits[0]))
    state = folder / "state.json"
    if state.exists():
        names = [f["filename"] for f in json.loads(state.read_text()).get("_data_files", [])]
        if names:
            return [folder / n for n in names]
    files = sorted(
        p
        for p in folder.iterdir()
        if p.suffix in (".arrow", ".parquet", ".jsonl", ".json")
        and p.name not in ("dataset_info.json", "state.json", "dataset_dict.json")
    )
    if not files:
        raise UserError(f"{folder}: no .arrow, .parquet or .jsonl files; expected a dataset saved with save_to_disk")
    return files


def _rows(path: Path) -> Iterator[tuple[str, str, Any]]:
    if path.suffix == ".jsonl":
        yield from _jsonl(path)
    elif path.suffix == ".json":
        yield from _json(path)
    elif path.suffix in (".parquet", ".arrow"):
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(path) if path.suffix == ".parquet" else _read_arrow(path)
        except (pa.ArrowInvalid, OSError) as e:
            raise UserError(f"{path}: cannot read as {path.suffix[1:]} ({e})") from None
        for i, record in enumerate(table.to_pylist()):
            yield f"{path} row {i}", f"row-{i}", record
    else:
        yield from _jsonl(path)


def _records(path: Path, folder_only: bool) -> Iterator[tuple[str, str, Any]]:
    if not path.exists():
        raise UserError(f"{path}: no such file or folder")
    if path.is_dir():
        files = _table_files(path)
        for f in files:  # row ids continue across files so they stay unique
            prefix = f"{f.stem}/" if len(files) > 1 else ""
            for where, pos, record in _rows(f):
                yield where, prefix + pos, record
    elif folder_only:
        raise UserError(f"{path}: --format hf expects a local Hugging Face dataset folder, got a file")
    elif not path.is_file():
        raise UserError(f"{path}: not a regular file (a device, a pipe or a socket); give a file of conversations")
    else:
        yield from _rows(path)


def read_conversations(path: Path, fmt: str = "auto") -> list[dict[str, Any]]:
    """All conversations in `path`, normalised (see the module docstring)."""
    if fmt not in FORMATS:
        raise UserError(f"unknown format {fmt!r}; choose one of {list(FORMATS)}")
    path = Path(path)
    parser = PARSERS.get(fmt)
    out = []
    for where, pos, record in _records(path, folder_only=fmt == "hf"):
        if parser is None:  # auto / hf: the first record decides
            parser = PARSERS[detect_format(record, where)]
        if not isinstance(record, dict):
            raise UserError(f"{where}: expected a JSON object per record, got {type(record).__name__}")
        messages = parser(record, where)
        if not messages:
            raise UserError(f"{where}: empty conversation (no messages); remove it or fill it in")
        rid = next((record[k] for k in ID_KEYS if record.get(k) is not None), pos)
        out.append({"id": str(rid), "messages": messages})
    if not out:
        raise UserError(f"{path}: no conversations found (the file is empty)")
    return out
