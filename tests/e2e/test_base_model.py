"""A target without a chat template (a base model), through every stage on CPU (issue 18 item 3).

The tiny Llama target folder, its tokenizer stripped of its chat template:
  - completion mode: `prepare --completion` on plain text and prompt/completion pairs (loss on
    the completion, or with --loss-on all on every token), and on `synth --completion`'s
    continuations of raw prompts -> extract -> train -> `eval --completion` on raw prompts,
    speculative output equal to plain decoding;
  - `--chat-template FILE` in prepare, eval and synth alike;
  - without either, eval, synth and prepare stop with one `error:` line naming both ways on, and
    leave no output behind.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from draftsmith.data.dataset import load_dataset
from tests.helpers import ASSETS, cli_ok, cli_refused, write_jsonl

pytestmark = pytest.mark.slow

TEXTS = ["The cat sat on the mat and looked at the door.", "Water boils at one hundred degrees."]
PAIRS = [("Q: What is two plus two?\nA:", " Four."), ("Translate to French: cat =>", " chat")]
QUESTIONS = [{"prompt": "Once upon a time"}, {"turns": ["The capital of France is", " and of Italy"]}]


@pytest.fixture(scope="module")
def base_target(tmp_path_factory: pytest.TempPathFactory, tiny_target_dir: Path) -> Path:
    """The tiny target with no chat template, as a base model's folder has none."""
    folder = shutil.copytree(tiny_target_dir, tmp_path_factory.mktemp("base") / "target")
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def test_completion_mode_every_stage(tmp_path: Path, base_target: Path, tokenizer) -> None:
    data = write_jsonl(tmp_path / "data.jsonl", [{"text": t} for t in TEXTS] * 4)
    pairs = write_jsonl(tmp_path / "pairs.jsonl", [{"prompt": p, "completion": c} for p, c in PAIRS] * 4)
    cli_ok("prepare", pairs, "--target", base_target, "--out", tmp_path / "pairs", "--completion")
    ds = load_dataset(tmp_path / "pairs")
    for i, (prompt, completion) in enumerate(PAIRS):  # the tokens of prompt + completion, the loss on the completion
        a, b = ds.offsets[i], ds.offsets[i + 1]
        assert ds.ids[a:b].tolist() == tokenizer(prompt + completion)["input_ids"]
        assert tokenizer.decode(ds.ids[a:b][ds.mask[a:b].astype(bool)]).strip() == completion.strip()
    cli_ok(
        "prepare", pairs, "--target", base_target, "--out", tmp_path / "pairs-all", "--completion", "--loss-on", "all"
    )
    assert load_dataset(tmp_path / "pairs-all").mask.all()
    meta = json.loads((tmp_path / "pairs-all" / "dataset.json").read_text())
    assert (meta["completion"], meta["loss_on"], meta["chat_template"]) == (True, "all", None)

    prompts = write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": p} for p, _ in PAIRS])
    cli_ok(
        "synth",
        prompts,
        "--target",
        base_target,
        "--out",
        tmp_path / "synth" / "c.jsonl",
        "--device",
        "cpu",
        "--completion",
        "--max-new-tokens",
        "8",
        "--temperature",
        "1",
        "--keep-unfinished",
    )
    cli_ok(
        "prepare",
        tmp_path / "synth" / "c.jsonl",
        "--target",
        base_target,
        "--out",
        tmp_path / "synth-ds",
        "--completion",
    )
    assert len(load_dataset(tmp_path / "synth-ds")) == len(PAIRS)  # synth's answers are completions prepare reads

    cli_ok("prepare", data, "--target", base_target, "--out", tmp_path / "ds", "--completion")
    assert load_dataset(tmp_path / "ds").mask.all()  # plain text: all of it is the completion
    cli_ok(
        "extract",
        tmp_path / "ds",
        "--target",
        base_target,
        "--out",
        tmp_path / "store",
        "--device",
        "cpu",
        "--aux-layer-ids",
        "0,1,2",
    )
    cli_ok(
        "train",
        tmp_path / "ds",
        "--target",
        base_target,
        "--hidden",
        tmp_path / "store",
        "--out",
        tmp_path / "run",
        "--device",
        "cpu",
        "--steps",
        "2",
        "--batch-tokens",
        "64",
        "--val-fraction",
        "0",
        "--depth",
        "2",
    )
    bench = write_jsonl(tmp_path / "q.jsonl", QUESTIONS)
    cli_ok(
        "eval",
        "--target",
        base_target,
        "--drafter",
        tmp_path / "run",
        "--out",
        tmp_path / "eval",
        "--bench",
        bench,
        "--completion",
        "--device",
        "cpu",
        "--depth",
        "2",
        "--max-new-tokens",
        "8",
    )
    report = json.loads((tmp_path / "eval" / "report.json").read_text())
    answers = [json.loads(line) for line in (tmp_path / "eval" / "answers.jsonl").read_text().splitlines()]
    assert [len(a["turns"]) for a in answers] == [1, 2] and report["completion"] is True
    assert report["greedy_turns_matching_plain"] == report["greedy_turns_checked"] == 3, report  # lossless


def test_chat_template_file_in_every_stage(tmp_path: Path, base_target: Path) -> None:
    template = tmp_path / "chat.jinja"
    shutil.copy(ASSETS / "smollm2_tokenizer" / "chat_template.jinja", template)
    chats = write_jsonl(
        tmp_path / "chats.jsonl",
        [
            {"messages": [{"role": "user", "content": f"Say {w}."}, {"role": "assistant", "content": f"{w} {w}."}]}
            for w in ("one", "two", "three", "four")
        ],
    )
    cli_ok("prepare", chats, "--target", base_target, "--out", tmp_path / "ds", "--chat-template", template)
    assert json.loads((tmp_path / "ds" / "dataset.json").read_text())["chat_template"] == template.read_text()
    cli_ok(
        "synth",
        chats,
        "--target",
        base_target,
        "--out",
        tmp_path / "synth" / "c.jsonl",
        "--device",
        "cpu",
        "--chat-template",
        template,
        "--max-new-tokens",
        "8",
        "--temperature",
        "1",
        "--keep-unfinished",
        "--limit",
        "2",
    )
    assert len((tmp_path / "synth" / "c.jsonl").read_text().splitlines()) == 2
    cli_ok(
        "train",
        tmp_path / "ds",
        "--target",
        base_target,
        "--out",
        tmp_path / "run",
        "--device",
        "cpu",
        "--steps",
        "1",
        "--batch-tokens",
        "64",
        "--val-fraction",
        "0",
        "--depth",
        "1",
        "--aux-layer-ids",
        "0,1,2",
    )
    cli_ok(
        "eval",
        "--target",
        base_target,
        "--drafter",
        tmp_path / "run",
        "--out",
        tmp_path / "eval",
        "--device",
        "cpu",
        "--chat-template",
        template,
        "--num-questions",
        "1",
        "--max-new-tokens",
        "4",
        "--depth",
        "1",
    )
    assert (tmp_path / "eval" / "report.json").is_file()


def test_no_template_is_one_clear_error(tmp_path: Path, base_target: Path) -> None:
    chats = write_jsonl(tmp_path / "chats.jsonl", [{"prompt": "Say one.", "response": "One."}] * 2)
    cli_ok("prepare", chats, "--target", base_target, "--out", tmp_path / "ds", "--completion")
    cli_ok(
        "train",
        tmp_path / "ds",
        "--target",
        base_target,
        "--out",
        tmp_path / "run",
        "--device",
        "cpu",
        "--steps",
        "1",
        "--batch-tokens",
        "64",
        "--val-fraction",
        "0",
        "--depth",
        "1",
        "--aux-layer-ids",
        "0,1,2",
    )
    commands = {  # out folder -> the command line
        "prepare": ["prepare", chats, "--target", base_target, "--out", tmp_path / "prepare"],
        "synth": ["synth", chats, "--target", base_target, "--out", tmp_path / "synth" / "c.jsonl", "--device", "cpu"],
        "eval": [
            "eval",
            "--target",
            base_target,
            "--drafter",
            tmp_path / "run",
            "--out",
            tmp_path / "eval",
            "--device",
            "cpu",
            "--depth",
            "1",  # the depth the drafter was trained for (a deeper one is refused first)
        ],
    }
    for name, args in commands.items():
        output = cli_refused(*args)
        assert "has no chat template" in output and "--chat-template FILE" in output and "--completion" in output, (
            output
        )
        left = sorted(p.name for p in (tmp_path / name).rglob("*")) if (tmp_path / name).exists() else []
        assert set(left) <= {"progress.json"}, (name, left)
    assert "no such file" in cli_refused(
        "eval",
        "--target",
        base_target,
        "--drafter",
        tmp_path / "run",
        "--out",
        tmp_path / "eval",
        "--chat-template",
        tmp_path / "missing.jinja",
    )


def test_completion_refuses_conversations(tmp_path: Path, base_target: Path) -> None:
    chats = write_jsonl(
        tmp_path / "c.jsonl",
        [
            {
                "messages": [
                    {"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "Hi"},
                    {"role": "assistant", "content": "Hello."},
                ]
            }
        ],
    )
    output = cli_refused("prepare", chats, "--target", base_target, "--out", tmp_path / "ds", "--completion")
    assert "c.jsonl sample line-1: --completion takes plain text or one prompt/completion pair" in output, output
    assert not (tmp_path / "ds").exists()
