"""`draftsmith synth` input handling: empty or missing prompts, conflicting options,
de-duplication, system prompts, ids. None of these load a model."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from typer.testing import CliRunner

from draftsmith.cli import app
from draftsmith.synth.config import SynthConfig
from draftsmith.synth.run import load_work


def _invoke(*args):
    return CliRunner().invoke(app, ["synth", *args])


def test_empty_prompt_file_is_a_clear_error(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    res = _invoke(str(empty), "--out", str(tmp_path / "o" / "c.jsonl"))
    assert res.exit_code == 2 and "empty.jsonl" in res.output and "empty" in res.output
    assert not (tmp_path / "o" / "c.jsonl").exists()


def test_no_prompts_or_both(tmp_path):
    res = _invoke("--out", str(tmp_path / "c.jsonl"))
    assert res.exit_code == 2 and "--magpie" in res.output
    p = tmp_path / "p.jsonl"
    p.write_text('{"prompt": "hi"}\n')
    res = _invoke(str(p), "--magpie", "3", "--out", str(tmp_path / "c.jsonl"))
    assert res.exit_code == 2 and "not both" in res.output


def test_load_work_dedupes_keeps_user_turns_and_adds_system(tmp_path):
    p = tmp_path / "src.jsonl"
    rows = [
        {
            "id": "a",
            "messages": [
                {"role": "user", "content": "Q1"},
                {"role": "assistant", "content": "old"},
                {"role": "user", "content": "Q2"},
                {"role": "assistant", "content": "old2"},
            ],
        },
        {
            "id": "b",
            "messages": [
                {"role": "user", "content": " q1 "},
                {"role": "assistant", "content": "x"},
                {"role": "user", "content": "Q2"},
            ],
        },
        {"id": "c", "messages": [{"role": "system", "content": "Own system."}, {"role": "user", "content": "Q3"}]},
        {"id": "d", "messages": [{"role": "user", "content": "Q4"}]},
    ]
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    works, n_dup = load_work(SynthConfig(prompts=p, out=tmp_path / "o.jsonl", system="Default system.", seed=7))
    assert n_dup == 1 and [w.id for w in works] == ["src:a:s7", "src:c:s7", "src:d:s7"]
    assert works[0].users == ["Q1", "Q2"] and works[0].messages == [{"role": "system", "content": "Default system."}]
    assert works[1].messages == [{"role": "system", "content": "Own system."}]
    limited, _ = load_work(SynthConfig(prompts=p, out=tmp_path / "o.jsonl", limit=2))
    assert len(limited) == 2
    magpie, _ = load_work(SynthConfig(magpie=3, turns=2, out=tmp_path / "o.jsonl"))
    assert [w.id for w in magpie] == ["magpie:0:s0", "magpie:1:s0", "magpie:2:s0"] and magpie[0].users == [None, None]


def test_a_second_synth_into_a_locked_folder_is_refused(tmp_path):
    import os

    from draftsmith.fsutil import output_lock

    p = tmp_path / "p.jsonl"
    p.write_text('{"prompt": "hi"}\n')
    with output_lock(tmp_path / "o" / "c.synth"):  # another synth is writing there
        res = _invoke(str(p), "--out", str(tmp_path / "o" / "c.jsonl"))
    assert res.exit_code == 2 and f"another draftsmith process (pid {os.getpid()})" in res.output
    assert not (tmp_path / "o" / "c.jsonl").exists()


def test_resume_key_is_the_prompt_settings_and_seed(tmp_path, tiny_target_dir):
    """Issue 16 item 5: a rerun skips only conversations whose prompt, settings and seed match;
    changed prompts or settings, or a file written before resume keys, are refused, not skipped."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"Question {i}?"}) + "\n" for i in range(3)))
    out = tmp_path / "o" / "c.jsonl"
    args = [
        str(prompts),
        "--target",
        str(tiny_target_dir),
        "--out",
        str(out),
        "--device",
        "cpu",
        "--max-new-tokens",
        "6",
        "--temperature",
        "1",
        "--keep-unfinished",
    ]
    assert _invoke(*args).exit_code == 0
    lines = out.read_text().splitlines()
    assert len(lines) == 3 and all(len(json.loads(line)["key"]) == 24 for line in lines)
    again = _invoke(*args)
    assert again.exit_code == 0 and "nothing to do" in again.output and out.read_text().splitlines() == lines

    prompts.write_text(prompts.read_text().replace("Question 1?", "Another question?"))
    changed = _invoke(*args)
    assert changed.exit_code == 2 and "p:line-2:s0" in changed.output and "another prompt" in changed.output
    prompts.write_text(prompts.read_text().replace("Another question?", "Question 1?"))
    hotter = _invoke(*args[:-3], "--temperature", "0.7", "--keep-unfinished")
    assert hotter.exit_code == 2 and "other settings" in hotter.output
    assert out.read_text().splitlines() == lines  # nothing appended by a refused run

    out.write_text(
        "".join(json.dumps({k: v for k, v in json.loads(line).items() if k != "key"}) + "\n" for line in lines)
    )
    old = _invoke(*args)
    assert old.exit_code == 2 and "older draftsmith" in old.output and "another --out" in old.output


@pytest.mark.slow
def test_the_key_holds_the_target_files_not_their_path(tmp_path, tiny_target_dir):
    """A copy of the target (the same bytes, another path or new times) resumes; a target
    rewritten in place (a fine-tune saved over it) is another: its earlier kept answers are
    refused, not counted as done (they are no longer on-policy), its dropped ones tried again."""
    from safetensors.torch import load_file, save_file

    target = tmp_path / "target"
    shutil.copytree(tiny_target_dir, target)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"Question {i}?"}) + "\n" for i in range(3)))
    out = tmp_path / "o" / "c.jsonl"
    args = [str(prompts), "--out", str(out), "--device", "cpu", "--max-new-tokens", "6", "--temperature", "1"]
    first = _invoke(*args, "--target", str(target), "--keep-unfinished")
    assert first.exit_code == 0, first.output
    lines = out.read_text().splitlines()
    assert len(lines) == 3

    for f in target.iterdir():  # the same bytes, new times
        f.write_bytes(f.read_bytes())
        os.utime(f, (1, 1))
    moved = tmp_path / "moved"
    shutil.copytree(target, moved)
    for t in (target, moved):
        again = _invoke(*args, "--target", str(t), "--keep-unfinished")
        assert again.exit_code == 0 and "nothing to do" in again.output, again.output

    weights = target / "model.safetensors"
    save_file({k: v + 0.01 for k, v in load_file(weights).items()}, weights, metadata={"format": "pt"})
    stale = _invoke(*args, "--target", str(target), "--keep-unfinished")
    assert (
        stale.exit_code == 2 and "other settings (the target's files" in stale.output and "(and 2 more)" in stale.output
    )
    assert out.read_text().splitlines() == lines  # nothing appended by a refused run

    out.unlink()  # every answer dropped, by the earlier weights: the new ones try them again
    rows = [json.loads(line) for line in lines]
    out.with_name("c.dropped.jsonl").write_text(
        "".join(json.dumps({**{k: r[k] for k in ("id", "key", "repeat_key")}, "reason": "loop"}) + "\n" for r in rows)
    )
    retried = _invoke(*args, "--target", str(target), "--keep-unfinished")
    assert retried.exit_code == 0 and out.exists(), retried.output
    assert len(out.read_text().splitlines()) == 3
