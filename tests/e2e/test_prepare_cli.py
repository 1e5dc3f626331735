"""`draftsmith prepare` and `draftsmith vocab` through the real CLI.

The happy path runs on the embedded default (alias smollm2-135m, its GGUF tokenizer). The bad
input cases (issue 2, must-show item 5) use the tiny target folder, which loads in a second:
each checks the exit code, the message, and that no output and no temporary folder was left.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from draftsmith.data.dataset import load_dataset
from draftsmith.data.vocab import load_vocab
from tests.helpers import cli, masked_runs, write_jsonl

REPO = Path(__file__).parents[2]
GSM8K = REPO / "src/draftsmith/assets/gsm8k_train.jsonl"
SHAREGPT = [
    {
        "id": "chat-a",
        "conversations": [
            {"from": "system", "value": "You answer in one sentence."},
            {"from": "human", "value": "Name a prime number."},
            {"from": "gpt", "value": "Seven is a prime number."},
            {"from": "human", "value": "And an even one?"},
            {"from": "gpt", "value": "Two is the only even prime."},
        ],
    },
    {"id": "chat-b", "conversations": [{"from": "human", "value": "Say hi."}, {"from": "gpt", "value": "Hi!"}]},
]


@pytest.mark.slow
def test_prepare_and_vocab_on_the_embedded_default(tmp_path):
    from draftsmith.target import load_tokenizer

    data = write_jsonl(tmp_path / "chats.jsonl", SHAREGPT)
    out = tmp_path / "ds"
    r = cli("prepare", data, "--target", "smollm2-135m", "--out", out)
    assert r.exit_code == 0, r.output
    assert "samples kept" in r.output and "assistant tokens" in r.output  # the stats table
    assert {p.name for p in out.iterdir()} >= {
        "data.parquet",
        "dataset.json",
        "stats.json",
        "run.yaml",
        "progress.json",
    }
    meta = json.loads((out / "dataset.json").read_text())
    assert meta["format"] == "draftsmith-dataset" and meta["target"]["vocab_size"] == 49152
    stats = json.loads((out / "stats.json").read_text())
    assert stats["samples_kept"] == 2 and stats["throughput"]["samples_per_s"] > 0

    ds = load_dataset(out)
    tok = load_tokenizer("smollm2-135m")
    first = ds[0]
    assert masked_runs(tok, first["input_ids"].tolist(), first["loss_mask"].tolist()) == [
        "Seven is a prime number.<|im_end|>",
        "Two is the only even prime.<|im_end|>",
    ]
    assert stats["assistant_tokens"] == int(ds.mask.sum())

    vocab = tmp_path / "vocab.safetensors"
    r = cli("vocab", out, "--draft-vocab-size", "64", "--out", vocab)
    assert r.exit_code == 0, r.output
    d2t, t2d = load_vocab(vocab)
    assert int(t2d.sum()) == 64 and bool(t2d[ds.ids[ds.mask == 1]].all())  # every assistant token is in it


@pytest.mark.slow
def test_prepare_full_gsm8k_prints_and_writes_the_stats(tmp_path):
    """Issue 2, must-show item 3: all 7,473 GSM8K question/answer pairs on the embedded default."""
    out = tmp_path / "gsm8k"
    r = cli("prepare", GSM8K, "--target", "smollm2-135m", "--out", out, "--format", "pairs")
    assert r.exit_code == 0, r.output
    stats = json.loads((out / "stats.json").read_text())
    assert (stats["samples_in"], stats["samples_kept"], stats["truncated"]) == (7473, 7473, 0)
    assert stats["tokens"] == 1620444 and stats["assistant_tokens"] == 938363
    assert stats["throughput"]["samples_per_s"] > 0 and stats["throughput"]["tokenize_cpu_seconds"] > 0
    for row in ("conversations read", "7473", "1620444", "938363 (57.9%)", "length 129-256"):
        assert row in r.output
    assert len(load_dataset(out)) == 7473


@pytest.mark.slow
def test_prepare_pairs_with_length_policies(tmp_path, tiny_target_dir):
    rows = GSM8K.read_text().splitlines()[:40]
    data = tmp_path / "gsm8k.jsonl"
    data.write_text("\n".join(rows) + "\n")
    r = cli(
        "prepare",
        data,
        "--target",
        tiny_target_dir,
        "--out",
        tmp_path / "drop",
        "--format",
        "pairs",
        "--max-len",
        200,
        "--length-policy",
        "drop",
    )
    assert r.exit_code == 0, r.output
    drop = json.loads((tmp_path / "drop" / "stats.json").read_text())
    r = cli("prepare", data, "--target", tiny_target_dir, "--out", tmp_path / "trunc", "--max-len", 200)
    assert r.exit_code == 0, r.output
    trunc = json.loads((tmp_path / "trunc" / "stats.json").read_text())
    n_long = drop["dropped"]["longer than max_len"]
    assert 0 < n_long < 40 and drop["samples_kept"] == 40 - n_long
    assert trunc["truncated"] == n_long and trunc["samples_kept"] == 40 and trunc["max_length"] == 200
    assert sum(trunc["length_histogram"]["counts"]) == 40


# --- bad input: exit code, message, and nothing left behind ------------------------------------


def assert_failed(r, message: str, out: Path) -> None:
    assert r.exit_code != 0
    assert message in r.output, r.output
    assert not out.exists()
    assert not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")], "temporary folder left"


def test_malformed_json(tmp_path, tiny_target_dir):
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"prompt": "a", "response": "b"}) + "\n{not json}\n")
    r = cli("prepare", data, "--target", tiny_target_dir, "--out", tmp_path / "out")
    assert_failed(r, f"{data}:2: malformed JSON", tmp_path / "out")


def test_unknown_format(tmp_path, tiny_target_dir):
    data = write_jsonl(tmp_path / "d.jsonl", [{"foo": "bar"}])
    r = cli("prepare", data, "--target", tiny_target_dir, "--out", tmp_path / "out")
    assert_failed(r, f"{data}:1: unknown conversation format", tmp_path / "out")
    r = cli("prepare", data, "--target", tiny_target_dir, "--out", tmp_path / "out", "--format", "alpaca")
    assert_failed(r, "--format", tmp_path / "out")


def test_empty_conversation(tmp_path, tiny_target_dir):
    data = write_jsonl(tmp_path / "d.jsonl", [SHAREGPT[1], {"conversations": []}])
    r = cli("prepare", data, "--target", tiny_target_dir, "--out", tmp_path / "out")
    assert_failed(r, f"{data}:2: empty conversation", tmp_path / "out")


def test_conversation_without_assistant_turn(tmp_path, tiny_target_dir):
    data = write_jsonl(tmp_path / "d.jsonl", [{"messages": [{"role": "user", "content": "hi"}]}])
    r = cli("prepare", data, "--target", tiny_target_dir, "--out", tmp_path / "out")
    assert_failed(r, f"{data} sample line-1: conversation has no assistant turn", tmp_path / "out")


def test_target_without_chat_template(tmp_path, tiny_target_dir):
    target = tmp_path / "base-model"
    shutil.copytree(tiny_target_dir, target)
    (target / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((target / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (target / "tokenizer_config.json").write_text(json.dumps(config))
    data = write_jsonl(tmp_path / "d.jsonl", SHAREGPT)
    r = cli("prepare", data, "--target", target, "--out", tmp_path / "out")
    assert_failed(r, "no chat template; pass one with --chat-template FILE", tmp_path / "out")
    template = tmp_path / "chat.jinja"
    shutil.copy(tiny_target_dir / "chat_template.jinja", template)
    r = cli("prepare", data, "--target", target, "--out", tmp_path / "out", "--chat-template", template)
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize("what", ["data", "target", "chat-template"])
def test_non_existent_path(tmp_path, tiny_target_dir, what):
    data = write_jsonl(tmp_path / "d.jsonl", SHAREGPT)
    args = {"data": data, "target": tiny_target_dir}
    args[what] = tmp_path / "missing"
    extra = ["--chat-template", args.pop("chat-template")] if what == "chat-template" else []
    r = cli("prepare", args["data"], "--target", args["target"], "--out", tmp_path / "out", *extra)
    assert_failed(r, str(tmp_path / "missing"), tmp_path / "out")
    assert "no such file" in r.output


def test_existing_output_needs_overwrite(tmp_path, tiny_target_dir):
    data = write_jsonl(tmp_path / "d.jsonl", SHAREGPT)
    out = tmp_path / "out"
    out.mkdir()
    (out / "mine.txt").write_text("keep")
    r = cli("prepare", data, "--target", tiny_target_dir, "--out", out)
    assert r.exit_code != 0 and "already exists; pass --overwrite" in r.output
    assert [p.name for p in out.iterdir()] == ["mine.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.jsonl", "out"]  # no temporary folder
    r = cli("prepare", data, "--target", tiny_target_dir, "--out", out, "--overwrite")
    assert r.exit_code == 2 and "was not made by `draftsmith prepare`" in r.output  # a folder it did not make
    assert [p.name for p in out.iterdir()] == ["mine.txt"]
    (out / "mine.txt").unlink()
    assert (
        cli("prepare", data, "--target", tiny_target_dir, "--out", out, "--overwrite").exit_code == 0
    )  # an empty folder
    r = cli("prepare", data, "--target", tiny_target_dir, "--out", out, "--overwrite")  # its own output
    assert r.exit_code == 0, r.output
    assert (out / "data.parquet").exists()
