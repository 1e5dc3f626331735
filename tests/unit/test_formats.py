"""Reading conversation formats: each format, detection, override, containers, and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from draftsmith.data.formats import read_conversations
from draftsmith.errors import UserError
from tests.helpers import write_jsonl

U = {"role": "user", "content": "hi"}
A = {"role": "assistant", "content": "hello"}
S = {"role": "system", "content": "be brief"}


@pytest.mark.parametrize(
    "record,messages",
    [
        (
            {
                "conversations": [
                    {"from": "system", "value": "be brief"},
                    {"from": "human", "value": "hi"},
                    {"from": "gpt", "value": "hello"},
                ]
            },
            [S, U, A],
        ),
        (
            {
                "system": "be brief",
                "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}],
            },
            [S, U, A],
        ),
        ({"messages": [S, U, A]}, [S, U, A]),
        ({"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}, A]}, [U, A]),
        ({"prompt": "hi", "response": "hello"}, [U, A]),
        ({"question": "hi", "answer": "hello"}, [U, A]),
        ({"instruction": "hi", "output": "hello"}, [U, A]),
        ({"instruction": "hi", "input": "x", "output": "hello"}, [{"role": "user", "content": "hi\n\nx"}, A]),
        ({"system": "be brief", "prompt": "hi", "completion": "hello"}, [S, U, A]),
        ({"turns": ["hi", "more"]}, [U, {"role": "user", "content": "more"}]),
        ({"prompt": "hi"}, [U]),
        ({"text": "hi"}, [U]),
    ],
)
def test_each_format_is_detected_and_normalised(tmp_path, record, messages):
    (conv,) = read_conversations(write_jsonl(tmp_path / "d.jsonl", [record]))
    assert conv == {"id": "line-1", "messages": messages}


def test_ids_from_fields_else_line_numbers(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(
        json.dumps({"id": "a", "prompt": "p"})
        + "\n\n"
        + json.dumps({"question_id": 81, "prompt": "q"})
        + "\n"
        + json.dumps({"prompt": "r"})
        + "\n"
    )
    assert [c["id"] for c in read_conversations(path)] == ["a", "81", "line-4"]


def test_format_override_beats_detection(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "hi", "response": "hello"}])
    assert read_conversations(path, "prompts")[0]["messages"] == [U]
    assert read_conversations(path, "pairs")[0]["messages"] == [U, A]


def test_mt_bench_asset_reads_as_user_turns():
    convs = read_conversations(Path(__file__).parents[2] / "src/draftsmith/assets/mt_bench.jsonl")
    assert len(convs) == 80 and convs[0]["id"] == "81"
    assert all(len(c["messages"]) == 2 and {m["role"] for m in c["messages"]} == {"user"} for c in convs)


def test_json_list_parquet_and_arrow_folder(tmp_path):
    records = [{"messages": [U, A]}, {"messages": [S, U, A]}]
    (tmp_path / "d.json").write_text(json.dumps(records, indent=1))
    pq.write_table(pa.Table.from_pylist(records), tmp_path / "d.parquet")
    hf = tmp_path / "hf"  # the layout `datasets.save_to_disk` writes: arrow IPC streams + state.json
    hf.mkdir()
    table = pa.Table.from_pylist(records)
    with pa.OSFile(str(hf / "data-00000-of-00001.arrow"), "wb") as f, pa.ipc.new_stream(f, table.schema) as w:
        w.write_table(table)
    (hf / "state.json").write_text(json.dumps({"_data_files": [{"filename": "data-00000-of-00001.arrow"}]}))
    (hf / "dataset_info.json").write_text("{}")
    dd = tmp_path / "dd"  # a DatasetDict: the train split is used
    (dd / "train").mkdir(parents=True)
    pq.write_table(table, dd / "train" / "part.parquet")
    (dd / "dataset_dict.json").write_text(json.dumps({"splits": ["train", "test"]}))
    expected = [r["messages"] for r in records]
    for path, fmt in [
        (tmp_path / "d.json", "auto"),
        (tmp_path / "d.parquet", "auto"),
        (hf, "auto"),
        (hf, "hf"),
        (dd, "auto"),
    ]:
        convs = read_conversations(path, fmt)
        assert [c["messages"] for c in convs] == expected, path
        assert [c["id"] for c in convs] == ["row-0", "row-1"]


# --- bad input --------------------------------------------------------------------------------


def test_malformed_json_names_file_and_line(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"prompt": "a", "response": "b"}) + "\n" + '{"prompt": "a", "response": \n')
    with pytest.raises(UserError, match=rf"{path}:2: malformed JSON"):
        read_conversations(path)


def test_unknown_record_format(tmp_path):
    with pytest.raises(UserError, match=r"d.jsonl:1: unknown conversation format \(keys: \['foo'\]\)"):
        read_conversations(write_jsonl(tmp_path / "d.jsonl", [{"foo": 1}]))


def test_unknown_format_name(tmp_path):
    with pytest.raises(UserError, match="unknown format 'alpaca'"):
        read_conversations(write_jsonl(tmp_path / "d.jsonl", [{"prompt": "a"}]), "alpaca")


def test_empty_conversation(tmp_path):
    with pytest.raises(UserError, match=r"d.jsonl:2: empty conversation"):
        read_conversations(write_jsonl(tmp_path / "d.jsonl", [{"messages": [U, A]}, {"messages": []}]))


def test_later_record_in_another_format(tmp_path):
    with pytest.raises(UserError, match=r"d.jsonl:2: no 'conversations' field"):
        read_conversations(
            write_jsonl(tmp_path / "d.jsonl", [{"conversations": [{"from": "human", "value": "x"}]}, {"messages": [U]}])
        )


def test_unknown_role_and_bad_content(tmp_path):
    with pytest.raises(UserError, match=r"d.jsonl:1: unknown role 'narrator'"):
        read_conversations(write_jsonl(tmp_path / "d.jsonl", [{"messages": [{"role": "narrator", "content": "x"}]}]))
    with pytest.raises(UserError, match=r"e.jsonl:1: message content must be a string"):
        read_conversations(write_jsonl(tmp_path / "e.jsonl", [{"prompt": 3, "response": "x"}]))


def test_missing_path_and_empty_file(tmp_path):
    with pytest.raises(UserError, match="no such file or folder"):
        read_conversations(tmp_path / "nope.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(UserError, match="no conversations found"):
        read_conversations(tmp_path / "empty.jsonl")


def test_hf_format_insists_on_a_folder(tmp_path):
    with pytest.raises(UserError, match="--format hf expects a local Hugging Face dataset folder"):
        read_conversations(write_jsonl(tmp_path / "d.jsonl", [{"prompt": "a"}]), "hf")
