"""Named prompt sources (`data/sources.py`): OpenAI Evals' registry layout with its license
exclusions, chitchat, gsm8k, Hugging Face datasets from local folders (save_to_disk and
parquet; no hub), and the errors: unknown name, missing package, unreachable hub, no text."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from draftsmith.data import sources
from draftsmith.data.sources import EVALS_EXCLUDED, evals_messages, label, parse_hf, read_source
from draftsmith.errors import UserError
from tests.helpers import write_jsonl


def fake_evals(root: Path) -> Path:
    """A registry/data folder in evals' layout: tasks with chat and string inputs, a few-shot
    file, a task without prompts, an excluded folder, and lines that are no samples."""
    data = root / "evals" / "registry" / "data"
    write_jsonl(
        data / "arithmetic" / "samples.jsonl",
        [
            {
                "input": [{"role": "system", "content": "Answer with a number."}, {"role": "user", "content": "2+2?"}],
                "ideal": "4",
            },
            {"input": [{"role": "user", "content": "3+5?"}], "ideal": "8"},
            "not json at all",
            {"input": {"odd": "dict"}},
        ],
    )
    write_jsonl(
        data / "arithmetic" / "few_shot.jsonl",
        [
            {
                "sample": [
                    {"role": "system", "content": "ex", "name": "example_user"},
                    {"role": "system", "content": "ans", "name": "example_assistant"},
                ]
            },
        ],
    )
    write_jsonl(data / "trivia" / "nested" / "q.jsonl", [{"input": "Capital of France?", "ideal": "Paris"}])
    write_jsonl(data / "agents" / "tasks.jsonl", [{"task_name": "x", "max_steps": 3}])
    for name in EVALS_EXCLUDED[:2]:
        write_jsonl(data / name / "samples.jsonl", [{"input": "licensed otherwise", "ideal": "x"}])
    write_jsonl(data / "newly_excluded" / "samples.jsonl", [{"input": "also licensed otherwise", "ideal": "x"}])
    (root / "LICENSE.md").write_text("MIT ...\n- **Location**: evals/registry/data/newly_excluded\n")
    return data


def test_evals_layout_exclusions_and_conversion(tmp_path):
    src = read_source("evals", path=fake_evals(tmp_path))
    assert src.name == "evals" and src.license == "MIT"
    by_id = {c["id"]: c for c in src.convs}
    assert sorted(by_id) == [
        "arithmetic/few_shot:line-1",
        "arithmetic/samples:line-1",
        "arithmetic/samples:line-2",
        "trivia/nested/q:line-1",
    ]
    assert by_id["arithmetic/samples:line-1"]["messages"] == [
        {"role": "system", "content": "Answer with a number."},
        {"role": "user", "content": "2+2?"},
    ]
    assert by_id["trivia/nested/q:line-1"] == {
        "id": "trivia/nested/q:line-1",
        "task": "trivia",
        "messages": [{"role": "user", "content": "Capital of France?"}],
    }
    # a few-shot example: example_user -> user, the trailing example answer is dropped (synth answers anew)
    assert by_id["arithmetic/few_shot:line-1"]["messages"] == [{"role": "user", "content": "ex"}]
    assert not any("licensed otherwise" in m["content"] for c in src.convs for m in c["messages"])
    assert set(EVALS_EXCLUDED) | {"newly_excluded"} == set(src.skipped["license_excluded_tasks"])
    assert src.skipped["tasks_without_prompts"] == ["agents"] and src.skipped["unusable_lines"] == 3


def test_evals_messages_folds_system_turns_and_keeps_multi_turn():
    assert evals_messages(
        {
            "input": [
                {"role": "system", "content": "S"},
                {"role": "user", "content": "u1"},
                {"role": "assistant", "content": "a1"},
                {"role": "system", "content": "note"},
                {"role": "user", "content": "u2"},
            ]
        }
    ) == [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "u1"},
        {"role": "assistant", "content": "a1"},
        {"role": "user", "content": "note\n\nu2"},
    ]
    assert evals_messages({"input": [{"role": "system", "content": "only a system prompt"}]}) == [
        {"role": "user", "content": "only a system prompt"}
    ]
    assert evals_messages({"input": [{"role": "user", "content": "q"}, {"role": "system", "content": "after"}]}) == [
        {"role": "user", "content": "q\n\nafter"}
    ]
    assert (
        evals_messages({"input": "  "}) is None
        and evals_messages({"input": [{"role": "tool", "content": "x"}]}) is None
    )


def test_chitchat_and_gsm8k(tmp_path):
    cc = tmp_path / "chitchat_dataset"
    cc.mkdir()
    (cc / "dataset.json").write_text(
        json.dumps(
            {
                "c1": {
                    "messages": [
                        [{"text": "Hello", "sender": "a"}, {"text": "How are you?", "sender": "a"}],
                        [{"text": "Fine.", "sender": "b"}],
                        [{"text": "Good to hear.", "sender": "a"}],
                    ]
                }
            }
        )
    )
    src = read_source("chitchat", path=cc)
    assert src.convs == [
        {
            "id": "c1",
            "task": "chitchat",
            "messages": [
                {"role": "user", "content": "Hello How are you?"},
                {"role": "assistant", "content": "Fine."},
                {"role": "user", "content": "Good to hear."},
            ],
        }
    ]
    gsm = read_source("gsm8k")
    assert len(gsm.convs) == 7473 and gsm.license == "MIT" and gsm.convs[0]["task"] == "gsm8k"


def test_unknown_source_and_missing_package(tmp_path, monkeypatch):
    with pytest.raises(UserError, match=r"unknown source 'evalz'.*\['chitchat', 'evals', 'gsm8k'\]"):
        read_source("evalz")
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "evals" else real(name, *a))
    with pytest.raises(UserError, match=r"'evals' package, which is not installed: pip install --no-deps evals"):
        read_source("evals")
    with pytest.raises(UserError, match="evals: no registry data folder"):
        read_source("evals", path=tmp_path / "nowhere")


def test_a_file_keeps_its_stem_as_name(tmp_path):
    p = write_jsonl(tmp_path / "mine.jsonl", [{"prompt": "hi"}])
    src = read_source(p)
    assert src.name == label(p) == "mine" and src.convs == [
        {"id": "line-1", "task": "mine", "messages": [{"role": "user", "content": "hi"}]}
    ]
    assert sources.answers(p) and sources.answers("gsm8k") and not sources.answers("evals")


def test_parse_hf():
    assert parse_hf("hf:org/name") == ("org/name", "train")
    assert parse_hf("hf:org/name:test") == ("org/name", "test")
    assert label("hf:HuggingFaceH4/ultrachat_200k:train_sft") == "ultrachat_200k:train_sft"


# --- Hugging Face datasets, local folders in the hub's layouts ----------------------------------

ROWS = [
    {"id": "a", "messages": [{"role": "user", "content": "Q1"}, {"role": "assistant", "content": "A1"}]},
    {"id": "b", "messages": [{"role": "user", "content": "Q2"}, {"role": "assistant", "content": "A2"}]},
]


@pytest.fixture
def datasets():
    return pytest.importorskip("datasets")


def test_hf_save_to_disk_folder_with_splits(tmp_path, datasets):
    folder = tmp_path / "ds"
    datasets.DatasetDict(
        {"train": datasets.Dataset.from_list(ROWS), "test": datasets.Dataset.from_list(ROWS[:1])}
    ).save_to_disk(str(folder))
    src = read_source(f"hf:{folder}")
    assert [c["id"] for c in src.convs] == ["a", "b"] and src.convs[1]["messages"][0] == {
        "role": "user",
        "content": "Q2",
    }
    assert len(read_source(f"hf:{folder}:test").convs) == 1
    with pytest.raises(UserError, match="no split 'dev'"):
        read_source(f"hf:{folder}:dev")


def test_hf_parquet_folder_and_text_field(tmp_path, datasets):
    folder = tmp_path / "pq"
    folder.mkdir()
    datasets.Dataset.from_list(
        [{"instruction_text": "Write a haiku.", "n": 1}, {"instruction_text": "Sum 2 and 3.", "n": 2}]
    ).to_parquet(str(folder / "train-00000.parquet"))
    src = read_source(f"hf:{folder}", text_field="instruction_text")
    assert [c["messages"] for c in src.convs] == [
        [{"role": "user", "content": "Write a haiku."}],
        [{"role": "user", "content": "Sum 2 and 3."}],
    ]
    with pytest.raises(UserError, match=rf"hf:{folder} row 0: unknown conversation format"):
        read_source(f"hf:{folder}")  # no field a format knows: the error names the source
    with pytest.raises(UserError, match=rf"hf:{folder}: no column 'prompt'"):
        read_source(f"hf:{folder}", text_field="prompt")


def test_hf_without_a_hub_is_a_clear_error(monkeypatch, datasets):
    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'org/name' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(UserError, match=r"hf:org/name: the Hugging Face Hub cannot be reached from here.*save_to_disk"):
        read_source("hf:org/name")


def test_hf_without_datasets_names_the_extra(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "datasets", None)  # import fails as when it is not installed
    with pytest.raises(UserError, match=r"'datasets' package: pip install 'draftsmith\[hf\]'"):
        read_source("hf:org/name")
