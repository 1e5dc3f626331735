"""Prompt and conversation sources by name: files, prompt sets that installed packages ship as
data, and Hugging Face datasets.

    read_source(spec, fmt="auto") -> Source(name, spec, license, convs, skipped)

`spec` is an existing file or folder (any container `formats.py` reads), else a name: `gsm8k`
(bundled), `evals`, `chitchat` or `hf:ORG/NAME[:SPLIT]`; docs/synth.md ("Named sources") tables
them with their licenses and the evals folders left out for theirs. Each conversation is
`{"id", "messages", "task"}` as `read_conversations` gives them, plus the task it belongs to (an
evals folder; the source's name elsewhere), for per-task caps. Package sources read the
package's data files and never import the package. A missing package, an unknown name, an
unreachable hub or a dataset without a usable text field is a UserError that names the source
and says what to do.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from draftsmith.data.formats import ID_KEYS, PARSERS, detect_format, read_conversations
from draftsmith.errors import UserError

# OpenAI Evals' LICENSE.md (evals 3.0.1): these registry/data folders hold data under licenses
# other than MIT (CC BY-NC, CC BY-SA, ODC-By, WordNet, ...). Left out always; a LICENSE.md of
# the installed version that names more folders adds those.
MIX_FILE = "mix.json"  # written by `synth --mix` in its output's run folder (`synth_folder`)
SYNTH_FOLDER = ".synth"  # the suffix of that folder: OUT.jsonl -> OUT.synth/
EVALS_EXCLUDED = (
    "text_compression",
    "steganography",
    "schelling_point",
    "ballots",
    "sandbagging",
    "theory_of_mind",
    "already_said_that",
)


@dataclass
class Source:
    name: str  # short label: ids and mix.json use it
    spec: str  # what the user gave
    license: str
    convs: list[dict[str, Any]]
    skipped: dict[str, Any] = field(default_factory=dict)  # what was left out of the source, and why


@dataclass(frozen=True)
class NamedSource:
    license: str
    about: str
    package: str | None  # the pip package that ships the data (None: bundled with draftsmith)
    answers: bool  # whether its conversations carry answers (`prepare` can use them as they are)
    read: Callable[[Path | None], tuple[list[dict[str, Any]], dict[str, Any]]]  # data root -> convs, skipped


# --- evals -------------------------------------------------------------------------------------


def _package_dir(package: str, install: str) -> Path:
    """The folder of an installed package, found without importing it."""
    import importlib.util

    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise UserError(f"this source needs the '{install}' package, which is not installed: {INSTALL[install]}")
    return Path(next(iter(spec.submodule_search_locations)))


def evals_license_exclusions(root: Path) -> set[str]:
    """Folders that the evals LICENSE.md (package metadata, or a git checkout's root) puts under
    other licenses, on top of the built-in list."""
    texts = []
    try:
        from importlib.metadata import PackageNotFoundError, distribution

        texts.append(distribution("evals").read_text("LICENSE.md") or "")
    except (ImportError, PackageNotFoundError, OSError):
        pass
    for up in (root.parent.parent.parent / "LICENSE.md", root / "LICENSE.md"):  # checkout: evals/registry/data
        if up.is_file():
            texts.append(up.read_text(errors="replace"))
    found = {m for t in texts for m in re.findall(r"evals/registry/data/([\w.-]+)", t)}
    return set(EVALS_EXCLUDED) | found


def evals_messages(record: Any) -> list[dict[str, str]] | None:
    """The prompt of one evals sample as system + user turns, or None when it has none.

    Samples are `{"input": [chat messages] | "text", "ideal": ...}` (few-shot files wrap them in
    `{"sample": ...}`). Few-shot examples written as `system` messages named `example_user` /
    `example_assistant` become user / assistant turns; leading system messages stay the system
    turn, later ones are folded into the next user turn; a prompt with only system messages
    becomes one user turn; trailing assistant turns are dropped (synth answers anew)."""
    if isinstance(record, dict) and "input" not in record and "sample" in record:
        record = record["sample"] if isinstance(record["sample"], dict) else {"input": record["sample"]}
    if not isinstance(record, dict):
        return None
    value = record.get("input")
    if isinstance(value, str):
        return [{"role": "user", "content": value}] if value.strip() else None
    if not isinstance(value, list) or not value:
        return None
    msgs = []
    for m in value:
        if not isinstance(m, dict) or not isinstance(m.get("content"), str):
            return None
        role = {"example_user": "user", "example_assistant": "assistant"}.get(m.get("name"), m.get("role"))
        if role not in ("system", "user", "assistant"):
            return None
        msgs.append({"role": role, "content": m["content"]})
    if not any(m["role"] == "user" for m in msgs):
        text = "\n\n".join(m["content"] for m in msgs if m["role"] == "system").strip()
        return [{"role": "user", "content": text}] if text else None
    head = []
    while msgs and msgs[0]["role"] == "system":
        head.append(msgs.pop(0)["content"])
    out = [{"role": "system", "content": "\n\n".join(head)}] if head else []
    pending: list[str] = []  # system text waiting for the next user turn
    for m in msgs:
        if m["role"] == "system":
            pending.append(m["content"])
        elif m["role"] == "user":
            out.append({"role": "user", "content": "\n\n".join([*pending, m["content"]])})
            pending = []
        elif out and out[-1]["role"] == "user":  # an assistant turn answers the user turn before it
            out.append(m)
    if pending:
        last = max(i for i, m in enumerate(out) if m["role"] == "user")
        out[last] = {"role": "user", "content": "\n\n".join([out[last]["content"], *pending])}
        out = out[: last + 1]
    while out and out[-1]["role"] == "assistant":
        out.pop()
    return out if any(m["role"] == "user" and m["content"].strip() for m in out) else None


def _json_values(raw: bytes) -> list[Any]:
    """The JSON values on one line: usually one; some evals files run several together on one
    line. A line that does not parse gives [None] (counted as unusable)."""
    text = raw.decode("utf-8", errors="replace").strip()
    decoder, out, pos = json.JSONDecoder(), [], 0
    try:
        while pos < len(text):
            value, pos = decoder.raw_decode(text, pos)
            out.append(value)
            while pos < len(text) and text[pos].isspace():
                pos += 1
    except ValueError:
        out.append(None)
    return out


def read_evals(root: Path | None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Every sample of every task folder under evals/registry/data, minus the license exclusions.
    A line that is not a usable sample is skipped and counted; a task without any is listed."""
    root = root or _package_dir("evals", "evals") / "registry" / "data"
    if not root.is_dir():
        raise UserError(
            f"evals: no registry data folder at {root}; give the evals registry/data folder as the source's 'path'"
        )
    excluded = evals_license_exclusions(root)
    convs: list[dict[str, Any]] = []
    unusable: Counter[str] = Counter()
    empty_tasks = []
    for task_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        task = task_dir.name
        if task in excluded:
            continue
        n_before = len(convs)
        for path in sorted(task_dir.rglob("*.jsonl")):
            rel = path.relative_to(root).with_suffix("").as_posix()
            with path.open("rb") as f:
                for i, raw in enumerate(f, start=1):
                    if not raw.strip():
                        continue
                    for j, record in enumerate(_json_values(raw)):
                        messages = evals_messages(record)
                        if messages is None:
                            unusable[task] += 1
                            continue
                        convs.append(
                            {"id": f"{rel}:line-{i}" + (f".{j}" if j else ""), "messages": messages, "task": task}
                        )
        if len(convs) == n_before:
            empty_tasks.append(task)
    skipped = {
        "license_excluded_tasks": sorted(excluded),
        "tasks_without_prompts": empty_tasks,
        "unusable_lines": sum(unusable.values()),
    }
    return convs, skipped


# --- chitchat, gsm8k ----------------------------------------------------------------------------


def read_chitchat(root: Path | None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Chit-Chat Challenge conversations: the two speakers' message groups alternate, the first
    speaker's become user turns and the second's assistant turns."""
    path = (root or _package_dir("chitchat_dataset", "chitchat-dataset")) / "dataset.json"
    if not path.is_file():
        raise UserError(f"chitchat: no dataset.json at {path}")
    data = json.loads(path.read_text())
    convs = []
    for conv_id, conv in data.items():
        turns = [" ".join(u["text"] for u in group if u.get("text")) for group in conv.get("messages", [])]
        messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(turns)]
        if messages and messages[0]["content"].strip():
            convs.append({"id": conv_id, "messages": messages, "task": "chitchat"})
    return convs, {}


def read_gsm8k(root: Path | None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    from draftsmith.assets import GSM8K_TRAIN

    return [{**c, "task": "gsm8k"} for c in read_conversations(root or GSM8K_TRAIN)], {}


SOURCES: dict[str, NamedSource] = {
    "gsm8k": NamedSource("MIT", "GSM8K train questions, bundled", None, True, read_gsm8k),
    "evals": NamedSource("MIT", "OpenAI Evals registry prompts, package evals", "evals", False, read_evals),
    "chitchat": NamedSource(
        "MIT", "Chit-Chat Challenge small talk, package chitchat-dataset", "chitchat-dataset", True, read_chitchat
    ),
}
INSTALL = {
    "evals": "pip install --no-deps evals  (46 MB; draftsmith reads only its data files. `pip install evals` "
    "would also pull its ~150 dependencies, TensorFlow among them)",
    "chitchat-dataset": "pip install 'draftsmith[chitchat]'  (or: pip install chitchat-dataset)",
    "datasets": "pip install 'draftsmith[hf]'  (or: pip install datasets)",
}


# --- Hugging Face datasets ----------------------------------------------------------------------


def parse_hf(spec: str) -> tuple[str, str]:
    """'hf:ORG/NAME[:SPLIT]' -> (hub name or local folder, split; default train)."""
    body = spec[3:]
    name, split = (body, "") if Path(body).exists() or ":" not in body else body.rsplit(":", 1)
    if not name:
        raise UserError(f"{spec}: expected hf:ORG/NAME or hf:ORG/NAME:SPLIT")
    return name, split or "train"


def load_hf(spec: str) -> Any:
    """The `datasets.Dataset` of an hf: spec: a local folder (save_to_disk, or data files) or a hub name."""
    try:
        import datasets
    except ImportError:
        raise UserError(f"{spec}: Hugging Face datasets need the 'datasets' package: {INSTALL['datasets']}") from None
    name, split = parse_hf(spec)
    local = Path(name)
    try:
        if local.is_dir() and ((local / "dataset_dict.json").exists() or (local / "state.json").exists()):
            ds = datasets.load_from_disk(str(local))
        else:
            ds = datasets.load_dataset(name, split=split)
    except (ConnectionError, TimeoutError) as e:
        raise UserError(
            f"{spec}: the Hugging Face Hub cannot be reached from here ({e}). Load the dataset on a machine "
            f"with hub access, `save_to_disk` it, copy the folder here and give hf:FOLDER[:SPLIT]"
        ) from None
    except (FileNotFoundError, ValueError, OSError) as e:
        raise UserError(f"{spec}: cannot load this dataset ({type(e).__name__}: {e})") from None
    if isinstance(ds, datasets.DatasetDict):
        if split not in ds:
            raise UserError(f"{spec}: no split {split!r}; it has {sorted(ds)}")
        ds = ds[split]
    return ds


def records_to_convs(
    rows: Iterable[Any], where: str, fmt: str = "auto", text_field: str | None = None, task: str | None = None
) -> list[dict[str, Any]]:
    """Conversations from dataset rows (dicts), as `read_conversations` makes them from a file.
    `text_field` takes one column as the single user prompt instead of detecting the format."""
    parser = PARSERS.get(fmt)
    out = []
    for i, record in enumerate(rows):
        at = f"{where} row {i}"
        if not isinstance(record, dict):
            raise UserError(f"{at}: expected a record with named fields, got {type(record).__name__}")
        if text_field is not None:
            if text_field not in record:
                raise UserError(f"{where}: no column {text_field!r} (columns: {sorted(record)[:12]})")
            text = record[text_field]
            if not isinstance(text, str):
                raise UserError(f"{at}: column {text_field!r} is {type(text).__name__}, not text")
            messages = [{"role": "user", "content": text}] if text.strip() else []
        else:
            if parser is None:
                parser = PARSERS[detect_format(record, at)]
            messages = parser(record, at)
        if not messages:
            continue
        rid = next((record[k] for k in ID_KEYS if record.get(k) is not None), f"row-{i}")
        out.append({"id": str(rid), "messages": messages, "task": task or where})
    if not out:
        raise UserError(f"{where}: no usable text (every record was empty)")
    return out


# --- resolving a spec ---------------------------------------------------------------------------


def label(spec: str | Path) -> str:
    """The short name of a source, as ids and mix.json use it."""
    s = str(spec)
    if s.startswith("hf:"):
        name, split = parse_hf(s)
        return f"{Path(name).name}:{split}"
    return s if s in SOURCES and not Path(s).exists() else Path(s).stem


def read_source(
    spec: str | Path,
    fmt: str = "auto",
    path: Path | None = None,
    text_field: str | None = None,
    license: str | None = None,
) -> Source:
    """Resolve and read one source (see the module docstring). `path` points a named source at
    another copy of its data; `text_field` names the prompt column of a dataset or file."""
    s = str(spec)
    name = label(s)
    if s.startswith("hf:"):
        ds = load_hf(s)
        return Source(name, s, license or _hf_license(ds), records_to_convs(ds, s, fmt, text_field, task=name))
    if Path(s).exists():
        if text_field is not None:
            raise UserError(
                f"{s}: 'text_field' applies to hf: datasets; a file's prompt field is detected from its keys"
            )
        return Source(name, s, license or "unknown", [{**c, "task": name} for c in read_conversations(Path(s), fmt)])
    if s in SOURCES:
        src = SOURCES[s]
        convs, skipped = src.read(Path(path) if path else None)
        if not convs:
            raise UserError(f"{s}: the source holds no usable prompts ({skipped})")
        return Source(name, s, license or src.license, convs, skipped)
    if "/" in s or Path(s).suffix:  # meant as a path
        raise UserError(f"{s}: no such file or folder")
    raise UserError(
        f"unknown source {s!r}: no such file or folder, not hf:ORG/NAME[:SPLIT], and not one of "
        f"the named sources {sorted(SOURCES)}"
    )


def answers(spec: str | Path) -> bool:
    """Whether a source's conversations come with answers (a named prompt set may not)."""
    s = str(spec)
    return not (s in SOURCES and not Path(s).exists() and not SOURCES[s].answers)


def _hf_license(ds: Any) -> str:
    info = getattr(ds, "info", None)
    return str(getattr(info, "license", "") or "unknown")


# --- the data card of a synth --mix output -------------------------------------------------------


def data_card(mix_json: dict[str, Any]) -> dict[str, Any]:
    """The short form of a finished mix.json for dataset.json and the drafter's meta: per source
    its name, license and conversations kept, plus what a source left out for licensing."""
    sources = []
    for s in mix_json.get("sources", []):
        entry = {
            "name": s["name"],
            "source": s["source"],
            "license": s["license"],
            "conversations": (s.get("synth") or {}).get("kept", s.get("selected")),
        }
        if s.get("license_excluded_tasks"):
            entry["left_out"] = s["license_excluded_tasks"]
        sources.append(entry)
    return {
        "mix": Path(str(mix_json.get("mix", ""))).name,
        "seed": mix_json.get("seed"),
        "conversations": mix_json.get("kept"),
        "sources": sources,
    }


def synth_folder(out: Path) -> Path:
    """The folder beside a synth output that holds the files of the runs that wrote it:
    progress.json, run.yaml, mix.json and the output lock (`OUT.jsonl` -> `OUT.synth/`), so that
    none of them lands loose in the folder that holds the output (issue 55)."""
    return out.with_name(out.stem + SYNTH_FOLDER)


def mix_card(conversations: Path) -> dict[str, Any] | None:
    """The data card of a synth output, from its mix.json (in `synth_folder`, or beside the
    output where a draftsmith before issue 55 wrote it); None when it has none, or when that
    mix.json belongs to another output file."""
    path = Path(conversations)
    found = [p for p in (synth_folder(path) / MIX_FILE, path.parent / MIX_FILE) if p.is_file()]
    if not path.is_file() or not found:
        return None
    try:
        mix_json = json.loads(found[0].read_text())
    except ValueError:
        return None
    return data_card(mix_json) if mix_json.get("output") == path.name else None
