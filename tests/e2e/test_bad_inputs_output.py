"""Issue 42's output probes, one test each, through the real CLI: an `--out` or `--overwrite` that
would destroy the command's own input, the working folder or a folder draftsmith did not make is
refused (exit 2, a clean `error:` naming the path and the fix, everything kept); a pipeline
stage whose external input changed runs again; `train --resume` neither rewrites the recorded
options nor stops at a torn newest checkpoint; `synth` never appends into its own prompts, counts
prompts it already answered under another file name as duplicates, and follows its own advice
after a run whose answers were all dropped.

Every row runs on the tiny target folder (a second to load) and inputs of a few lines.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from draftsmith.cli import app
from draftsmith.draft.checkpoint import save_drafter
from draftsmith.fsutil import MADE_FILE
from tests.helpers import cli, failed, make_tiny_drafter, tiny_train_args, write_chats


def chats(path: Path, n: int, start: int = 0) -> Path:
    return write_chats(path, range(start, start + n))


def run_cli(*args: object, code: int = 0, says: str = "") -> str:
    """The command's output; it exits with `code` (and a clean `error:` when not 0) and says `says`."""
    r = cli(*args)
    if code:
        failed(r, code, says)
    else:
        assert r.exit_code == 0 and says in r.output, r.output
    return r.output


def tree(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.fixture
def no_rmtree(monkeypatch: pytest.MonkeyPatch) -> None:
    """Guard rails for probes that, on a broken build, would delete `/`, the home folder or the
    working folder: nothing may be deleted at all."""

    def refuse(path: object, *args: object, **kwargs: object) -> None:
        raise AssertionError(f"rmtree({path}) called")

    monkeypatch.setattr(shutil, "rmtree", refuse)


# -- 1. --out and --overwrite never destroy an input, the working folder or a foreign folder ----


def test_prepare_out_dot_overwrite_keeps_the_current_folder(tmp_path, tiny_target_dir, monkeypatch, no_rmtree):
    monkeypatch.chdir(tmp_path)
    chats(tmp_path / "conv.jsonl", 3)
    before = tree(tmp_path)
    run_cli(
        "prepare",
        "conv.jsonl",
        "--target",
        tiny_target_dir,
        "--out",
        ".",
        "--overwrite",
        code=2,
        says="--out . is the current folder",
    )
    assert tree(tmp_path) == before


@pytest.mark.parametrize("out", ["/", "~"])
def test_out_root_or_home_is_refused(tmp_path, tiny_target_dir, out, no_rmtree):
    conv = chats(tmp_path / "conv.jsonl", 3)
    out = os.path.expanduser(out)
    run_cli(
        "prepare",
        conv,
        "--target",
        tiny_target_dir,
        "--out",
        out,
        "--overwrite",
        code=2,
        says="needs an output folder of its own",
    )


def test_prepare_out_holding_its_input_is_refused(tmp_path, tiny_target_dir):
    data = tmp_path / "sb1" / "data"
    data.mkdir(parents=True)
    conv = chats(data / "conv.jsonl", 3)
    run_cli(
        "prepare",
        conv,
        "--target",
        tiny_target_dir,
        "--out",
        data,
        "--overwrite",
        code=2,
        says=f"--out {data} holds this command's input {conv}",
    )
    assert tree(data) == ["conv.jsonl"]


def test_export_into_the_training_run_it_exports_is_refused(tmp_path):
    run = tmp_path / "sb4" / "train"
    save_drafter(make_tiny_drafter(), run / "drafter")
    (run / "checkpoints" / "step_00000002").mkdir(parents=True)
    (run / "metrics.jsonl").write_text("{}\n")
    before = tree(run)
    run_cli(
        "export",
        run / "drafter",
        "--out",
        run,
        "--overwrite",
        code=2,
        says=f"holds this command's input {run / 'drafter'}",
    )
    run_cli(
        "export",
        run / "drafter",
        "--out",
        run / "checkpoints",
        "--overwrite",
        code=2,
        says=f"--overwrite: {run / 'checkpoints'} was not made by `draftsmith export` (it has no {MADE_FILE} marker",
    )
    assert tree(run) == before
    (run / MADE_FILE).write_text(json.dumps({"command": "train"}))  # as train marks its run
    run_cli(
        "export",
        run / "drafter",
        "--out",
        run / "exported",
        code=2,
        says=f"is inside {run}, the output of the `draftsmith train` run that {run / 'drafter'} comes from",
    )
    assert not (run / "exported").exists()


def test_overwrite_replaces_only_the_same_commands_output(tmp_path, tiny_target_dir):
    """prepare's own output is replaced (moved aside, deleted once the new one is in place: no
    temporary folder left); export --overwrite of that dataset is refused."""
    conv, ds = chats(tmp_path / "conv.jsonl", 3), tmp_path / "ds"
    run_cli("prepare", conv, "--target", tiny_target_dir, "--out", ds)
    assert json.loads((ds / MADE_FILE).read_text()) == {"command": "prepare"}
    chats(conv, 5)
    run_cli("prepare", conv, "--target", tiny_target_dir, "--out", ds, "--overwrite")
    assert json.loads((ds / "dataset.json").read_text())["num_samples"] == 5
    assert sorted(p.name for p in tmp_path.iterdir()) == ["conv.jsonl", "ds"]
    drafter = save_drafter(make_tiny_drafter(), tmp_path / "drafter")
    run_cli(
        "export",
        drafter,
        "--out",
        ds,
        "--overwrite",
        code=2,
        says=f"--overwrite: {ds} was not made by `draftsmith export` (it is the output of `draftsmith prepare`)",
    )
    assert (ds / "data.parquet").exists()


def test_a_dangling_symlink_out_is_written_at_its_real_path(tmp_path, tiny_target_dir):
    conv, link, real = chats(tmp_path / "conv.jsonl", 3), tmp_path / "ds", tmp_path / "elsewhere" / "ds"
    link.symlink_to(real)
    run_cli("prepare", conv, "--target", tiny_target_dir, "--out", link)
    assert (real / "data.parquet").exists() and link.is_symlink()


def pipeline(tmp_path: Path, target: Path, top: str = "", stage: str = "", data: Path | None = None) -> Path:
    data = data or chats(tmp_path / "conv.jsonl", 3)
    path = tmp_path / "pipe.yaml"
    path.write_text(f"out: {tmp_path / 'run'}\ntarget: {target}\n{top}stages:\n  - prepare: {{data: {data}{stage}}}\n")
    return path


def test_pipeline_top_level_overwrite_keeps_a_foreign_folder(tmp_path, tiny_target_dir):
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "NOTES.txt").write_text("x\n")
    run_cli(
        "pipeline",
        pipeline(tmp_path, tiny_target_dir, top="overwrite: true\n", stage=f", out: {foreign}"),
        code=2,
        says=f"{foreign} already exists and this pipeline did not make it",
    )
    assert tree(foreign) == ["NOTES.txt"]


def test_pipeline_stage_out_outside_its_folder_is_refused(tmp_path, tiny_target_dir, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run_cli(
        "pipeline",
        pipeline(tmp_path, tiny_target_dir, stage=", out: ../../x"),
        code=2,
        says="pipeline stage prepare: out: ../../x is outside the pipeline's folder",
    )
    assert not (tmp_path.parent.parent / "x").exists()


# -- 2. reruns that go stale or mislabel ---------------------------------------------------------


def test_pipeline_reruns_prepare_when_its_input_file_grew(tmp_path, tiny_target_dir):
    conv = chats(tmp_path / "conv.jsonl", 20)
    pipe = pipeline(tmp_path, tiny_target_dir, data=conv)
    run_cli("pipeline", pipe)
    assert "done earlier, skipped" in run_cli("pipeline", pipe)
    chats(conv, 60)
    run_cli("pipeline", pipe, says=f"prepare: changed since it ran (input {conv} changed): running it again")
    assert json.loads((tmp_path / "run" / "prepare" / "dataset.json").read_text())["num_samples"] == 60


def test_pipeline_skips_a_stage_whose_target_was_written_again_alike(tmp_path, tiny_target_dir):
    """A target folder converted or copied again (the same bytes, new times: a new machine, a
    restore) is no change: the stages done with it are skipped, not run again over their output."""
    target = tmp_path / "target"
    shutil.copytree(tiny_target_dir, target)
    pipe = pipeline(tmp_path, target)
    run_cli("pipeline", pipe)
    for f in target.rglob("*"):
        if f.is_file():
            f.write_bytes(f.read_bytes())
            os.utime(f, (1, 1))
    assert "done earlier, skipped" in run_cli("pipeline", pipe)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory, tiny_target_dir: Path) -> Path:
    root = tmp_path_factory.mktemp("bad-outputs")
    run_cli("prepare", chats(root / "conv.jsonl", 4), "--target", tiny_target_dir, "--out", root / "ds")
    return root / "ds"


def train(ds: Path, target: Path, out: Path, *extra: object) -> list[object]:
    return tiny_train_args(ds, target, out, "--steps", "2", "--depth", "1", "--save-every", "1", *extra)


@pytest.mark.slow
def test_train_resume_with_other_options_is_refused_and_keeps_run_yaml(tmp_path, dataset, tiny_target_dir):
    out = tmp_path / "train"
    run_cli(*train(dataset, tiny_target_dir, out))
    record = (out / "run.yaml").read_text()
    run_cli(
        *train(dataset, tiny_target_dir, out, "--resume", "--lr", "0.01"),
        code=2,
        says=f"--resume: {out} was made with other options: --lr 0.01 (the run's: 0.002)",
    )
    assert (out / "run.yaml").read_text() == record
    run_cli(
        *train(dataset, tiny_target_dir, out, "--resume"), says=f"{out} finished at step 2 already; nothing to train"
    )
    assert (out / "run.yaml").read_text() == record  # the command line differs: a rewrite would show
    # the record stands for the options not given: no need to repeat them
    run_cli("train", dataset, "--target", tiny_target_dir, "--out", out, "--resume", says="nothing to train")


@pytest.mark.slow
def test_train_resume_falls_back_from_a_torn_newest_checkpoint(tmp_path, dataset, tiny_target_dir):
    out = tmp_path / "train"
    run_cli(*train(dataset, tiny_target_dir, out))
    newest = out / "checkpoints" / "step_00000002" / "model.safetensors"
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])
    said = run_cli(
        *train(dataset, tiny_target_dir, out, "--resume"),
        says=f"[train] --resume: {newest}: not a readable safetensors file",
    )
    assert "resuming from the checkpoint before it" in said
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps[-1] == 2 and (out / "drafter" / "model.safetensors").exists()


# -- 3. synth's output ---------------------------------------------------------------------------


def synth(prompts: Path, target: Path, out: Path, *extra: object) -> list[object]:
    return [
        "synth",
        prompts,
        "--target",
        target,
        "--out",
        out,
        "--device",
        "cpu",
        "--max-new-tokens",
        "6",
        "--temperature",
        "1",
        *extra,
    ]


def test_synth_out_equal_to_its_prompts_is_refused(tmp_path, tiny_target_dir):
    prompts = chats(tmp_path / "p.jsonl", 2)
    before = prompts.read_text()
    run_cli(*synth(prompts, tiny_target_dir, prompts), code=2, says=f"--out {prompts} is this command's input")
    assert prompts.read_text() == before


@pytest.mark.slow
def test_synth_counts_prompts_answered_under_another_file_name(tmp_path, tiny_target_dir):
    out, first = tmp_path / "out" / "c.jsonl", chats(tmp_path / "p.jsonl", 3)
    run_cli(*synth(first, tiny_target_dir, out, "--keep-unfinished"))
    again = shutil.copy(first, tmp_path / "q.jsonl")
    r = CliRunner().invoke(app, [str(a) for a in synth(again, tiny_target_dir, out, "--keep-unfinished")])
    assert r.exit_code == 0 and "duplicate prompts skipped 3" in r.output, r.output
    assert len(out.read_text().splitlines()) == 3


@pytest.mark.slow
def test_synth_follows_its_own_advice_after_every_answer_was_dropped(tmp_path, tiny_target_dir):
    out, prompts = tmp_path / "out" / "c.jsonl", chats(tmp_path / "p.jsonl", 2)
    run_cli(*synth(prompts, tiny_target_dir, out), code=2, says="pass --keep-unfinished")
    run_cli(*synth(prompts, tiny_target_dir, out, "--keep-unfinished"))
    assert len(out.read_text().splitlines()) == 2
