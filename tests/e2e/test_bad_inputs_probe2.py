"""Issue 55's probes (reliability, second probe), one test each, through the real CLI on the tiny
target folder: no command takes over a folder it did not make, no output destroys an input or
another command's output. Each refusal comes before the target loads: seconds a test.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from draftsmith.fsutil import MADE_FILE, made_by
from tests.helpers import cli, failed, prepared_chats, tiny_train_args


@pytest.fixture(scope="module")
def dataset(tmp_path_factory, tiny_target_dir) -> Path:
    """A dataset of four short exchanges prepared for the tiny target."""
    return prepared_chats(tmp_path_factory.mktemp("probe2"), tiny_target_dir)[1]


def tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# -- 1. train and extract never take over a folder they did not make -------------------------------


@pytest.mark.parametrize("overwrite", [False, True])
def test_train_refuses_a_folder_made_by_hand(tmp_path, dataset, tiny_target_dir, overwrite):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("precious")
    extra = ["--steps", "1"] + (["--overwrite"] if overwrite else [])
    r = cli(*tiny_train_args(dataset, tiny_target_dir, mine, *extra))
    failed(r, 2, "is not a `draftsmith train` output", "no .draftsmith marker")
    assert tree(mine) == {"notes.txt": b"precious"}


def test_extract_refuses_a_training_run(tmp_path, dataset, tiny_target_dir):
    run = tmp_path / "run"
    run.mkdir()
    (run / MADE_FILE).write_text(json.dumps({"command": "train"}))
    (run / "run.yaml").write_text("config: {steps: 1}\n")
    before = tree(run)
    r = cli("extract", dataset, "--target", tiny_target_dir, "--out", run, "--device", "cpu")
    failed(r, 2, "it is the output of `draftsmith train`")
    assert tree(run) == before and made_by(run) == "train"


def test_extract_never_deletes_files_in_a_folder_that_is_not_a_store(tmp_path, dataset, tiny_target_dir):
    us = tmp_path / "us"
    (us / "rows_0-1999").mkdir(parents=True)
    (us / "rows_0-1999" / "mine.safetensors").write_text("x")
    r = cli("extract", dataset, "--target", tiny_target_dir, "--out", us, "--device", "cpu")
    failed(r, 2, "is not a `draftsmith extract` output")
    assert tree(us) == {"rows_0-1999/mine.safetensors": b"x"}


@pytest.mark.slow
def test_train_may_start_in_an_empty_folder(tmp_path, dataset, tiny_target_dir):
    out = tmp_path / "empty"
    out.mkdir()
    r = cli(*tiny_train_args(dataset, tiny_target_dir, out, "--steps", "1"))
    assert r.exit_code == 0, r.output
    assert made_by(out) == "train"


# -- 2. file outputs never replace another command's output ----------------------------------------


def test_vocab_out_inside_an_export_is_refused(tmp_path, dataset):
    export = tmp_path / "export"
    export.mkdir()
    (export / MADE_FILE).write_text(json.dumps({"command": "export"}))
    (export / "model.safetensors").write_bytes(b"weights")
    r = cli("vocab", dataset, "--out", export / "model.safetensors", "--overwrite")
    failed(r, 2, "the output of `draftsmith export`")
    assert (export / "model.safetensors").read_bytes() == b"weights"


def test_vocab_out_over_its_datasets_file_is_refused(tmp_path, dataset):
    r = cli("vocab", dataset, "--out", dataset / "dataset.json", "--overwrite")
    failed(r, 2, "--out")
    assert json.loads((dataset / "dataset.json").read_text())


def test_synth_out_as_a_hard_link_to_its_prompts_is_refused(tmp_path, tiny_target_dir):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "hi"}) + "\n")
    link = tmp_path / "out.jsonl"
    os.link(prompts, link)
    r = cli("synth", prompts, "--target", tiny_target_dir, "--out", link, "--device", "cpu")
    failed(r, 2, "this command's input")
    assert prompts.read_text() == json.dumps({"prompt": "hi"}) + "\n"


def test_synth_out_inside_a_dataset_is_refused(tmp_path, dataset, tiny_target_dir):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "hi"}) + "\n")
    before = tree(dataset)
    r = cli("synth", prompts, "--target", tiny_target_dir, "--out", dataset / "more.jsonl", "--device", "cpu")
    failed(r, 2, "the output of `draftsmith prepare`")
    assert tree(dataset) == before


def test_synth_keeps_its_run_files_beside_its_output_and_status_and_resume_find_them(tmp_path, tiny_target_dir):
    """progress.json, run.yaml and the lock of a synth run live in OUT.synth/, not loose in the
    folder that holds --out, whose own progress.json and run.yaml stay as they were."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"Question {i}?"}) + "\n" for i in range(2)))
    folder = tmp_path / "data"
    folder.mkdir()
    snap = {"stage": "theirs", "status": "done", "total": 1, "done": 1, "skipped": 0, "errors": 0, "rate": 1.0}
    theirs = {"progress.json": json.dumps({**snap, "updated_at": 0.0}).encode(), "run.yaml": b"config: {}\n"}
    for name, data in theirs.items():
        (folder / name).write_bytes(data)
    out = folder / "convs.jsonl"
    args = ["synth", prompts, "--target", tiny_target_dir, "--out", out, "--device", "cpu"]
    args += ["--max-new-tokens", "6", "--temperature", "1", "--keep-unfinished"]
    assert cli(*args).exit_code == 0
    assert {name: (folder / name).read_bytes() for name in theirs} == theirs
    side = folder / "convs.synth"
    assert made_by(side) == "synth" and (side / "run.yaml").is_file()
    assert json.loads((side / "progress.json").read_text())["done"] == 2
    for where in (folder, out, side):
        r = cli("status", where)
        assert r.exit_code == 0 and "synth" in r.output and "2/2 conversations" in r.output, r.output
    assert cli(*args).exit_code == 0  # a rerun resumes from the same files
    assert json.loads((side / "progress.json").read_text())["skipped"] == 2
    assert len(out.read_text().splitlines()) == 2


def test_synth_refuses_a_run_folder_it_did_not_make(tmp_path, tiny_target_dir):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "hi"}) + "\n")
    (tmp_path / "convs.synth").mkdir()
    (tmp_path / "convs.synth" / "progress.json").write_text("mine")
    r = cli("synth", prompts, "--target", tiny_target_dir, "--out", tmp_path / "convs.jsonl", "--device", "cpu")
    failed(r, 2, "was not made by `draftsmith synth`")
    assert (tmp_path / "convs.synth" / "progress.json").read_text() == "mine"
    r = cli("synth", prompts, "--target", tiny_target_dir, "--out", tmp_path / "c.synth", "--device", "cpu")
    failed(r, 2, "give a file name that does not end in .synth")


# -- 10. misleading: a file --out of a folder command is not told to use --overwrite ----------------


def test_a_file_out_of_a_folder_command_is_not_sent_to_overwrite(tmp_path, tiny_target_dir):
    conv = tmp_path / "c.jsonl"
    conv.write_text(json.dumps({"messages": [{"role": "user", "content": "a"}]}) + "\n")
    out = tmp_path / "afile"
    out.write_text("x")
    r = cli("prepare", conv, "--target", tiny_target_dir, "--out", out)
    failed(r, 2, "is a file")
    assert "pass --overwrite" not in r.output and out.read_text() == "x"


# -- 4. no training on data that is not what it claims ---------------------------------------------


@pytest.fixture(scope="module")
def store(tmp_path_factory, dataset, tiny_target_dir) -> Path:
    out = tmp_path_factory.mktemp("probe2_store") / "store"
    r = cli("extract", dataset, "--target", tiny_target_dir, "--out", out, "--device", "cpu")
    assert r.exit_code == 0, r.output
    return out


@pytest.mark.slow
def test_train_refuses_an_incomplete_store_unless_told(tmp_path, dataset, store, tiny_target_dir):
    part = shutil.copytree(store, tmp_path / "part")  # a copy, marked incomplete as a killed extraction leaves it
    meta = json.loads((part / "store.json").read_text())
    (part / "store.json").write_text(json.dumps({**meta, "complete": False}))
    args = tiny_train_args(dataset, tiny_target_dir, tmp_path / "run", "--hidden", part, "--steps", "1")
    failed(cli(*args), 2, "is incomplete", "--partial-store")
    assert not (tmp_path / "run").exists()
    r = cli(*args, "--partial-store")
    assert r.exit_code == 0 and "--partial-store" in r.output, r.output


def retokenized(src: Path, dst: Path, **target: object) -> Path:
    """A copy of dataset `src` whose dataset.json records another target."""
    shutil.copytree(src, dst)
    meta = json.loads((dst / "dataset.json").read_text())
    (dst / "dataset.json").write_text(json.dumps({**meta, "target": {**meta["target"], **target}}))
    return dst


def test_train_and_extract_refuse_a_dataset_of_another_tokenizer(tmp_path, dataset, tiny_target_dir):
    other = retokenized(dataset, tmp_path / "other", name="someone-else", tokenizer="0" * 16)
    r = cli(*tiny_train_args(other, tiny_target_dir, tmp_path / "run", "--steps", "1"))
    failed(r, 2, "tokenized for target 'someone-else'", "draftsmith prepare")
    r = cli("extract", other, "--target", tiny_target_dir, "--out", tmp_path / "store", "--device", "cpu")
    failed(r, 2, "tokenized for target 'someone-else'")
    assert not (tmp_path / "run").exists() and not (tmp_path / "store").exists()


def test_train_refuses_data_with_no_trainable_token(tmp_path, dataset, tiny_target_dir):
    zero = retokenized(dataset, tmp_path / "zero")
    table = pq.read_table(zero / "data.parquet")
    masks = [[0] * len(m) for m in table.column("loss_mask").to_pylist()]
    table = table.set_column(table.column_names.index("loss_mask"), "loss_mask", pa.array(masks, pa.list_(pa.uint8())))
    pq.write_table(table, zero / "data.parquet")
    failed(cli(*tiny_train_args(zero, tiny_target_dir, tmp_path / "a", "--steps", "1")), 2, "loss masks are all zero")
    r = cli(*tiny_train_args(dataset, tiny_target_dir, tmp_path / "b", "--steps", "1", "--batch-tokens", "1"))
    failed(r, 2, "nothing to train on")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


# -- 7. memory: the eval batch is capped at the number of questions ---------------------------------


def test_eval_batch_is_capped_at_the_number_of_questions(tmp_path, tiny_target_dir, tiny_model, monkeypatch):
    import draftsmith.evaluate.run as eval_run
    from draftsmith.draft.checkpoint import save_drafter
    from draftsmith.errors import UserError
    from tests.helpers import random_drafter

    def engine(model, aux, max_len, drafting, batch_size, *args, **kwargs):
        raise UserError(f"engine of {batch_size} rows")  # stop before anything is allocated

    monkeypatch.setattr(eval_run, "open_engine", engine)
    drafter = save_drafter(random_drafter(tiny_model, draft_vocab_size=300), tmp_path / "drafter")
    args = ["--device", "cpu", "--num-questions", "1", "--max-new-tokens", "4", "--no-speed", "--batch-size", "100000"]
    r = cli("eval", "--target", tiny_target_dir, "--drafter", drafter, "--out", tmp_path / "eval", *args)
    failed(r, 2, "engine of 1 rows")


# -- 8. tracebacks left by the probe: each a clean error (exit 2) naming the file -------------------


@pytest.mark.parametrize("command", ["prepare", "vocab", "synth"])
def test_a_symlink_loop_out_is_a_clean_error(tmp_path, dataset, tiny_target_dir, command):
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "hi"}) + "\n")
    args = {
        "prepare": ["prepare", prompts, "--target", tiny_target_dir],
        "vocab": ["vocab", dataset],
        "synth": ["synth", prompts, "--target", tiny_target_dir, "--device", "cpu"],
    }[command]
    failed(cli(*args, "--out", tmp_path / "a"), 2, f"--out {tmp_path / 'a'}", "symbolic link")


def test_prepare_from_a_device_or_a_deeply_nested_line_is_a_clean_error(tmp_path, tiny_target_dir):
    failed(cli("prepare", "/dev/zero", "--target", tiny_target_dir, "--out", tmp_path / "z"), 2, "not a regular file")
    deep = tmp_path / "deep.jsonl"
    deep.write_text("[" * 100_000 + "]" * 100_000 + "\n")
    failed(cli("prepare", deep, "--target", tiny_target_dir, "--out", tmp_path / "d"), 2, f"{deep}:1", "nested")
    assert not (tmp_path / "z").exists() and not (tmp_path / "d").exists()


def test_a_device_this_torch_lacks_is_refused_up_front(tmp_path, dataset, tiny_target_dir):
    import torch

    if torch.backends.mps.is_available():
        pytest.skip("this machine has an mps device")
    r = cli(*tiny_train_args(dataset, tiny_target_dir, tmp_path / "run", "--steps", "1"), "--device", "mps")
    assert r.exit_code == 2 and "no mps device" in r.output and not (tmp_path / "run").exists(), r.output


def test_a_drafter_json_of_absurd_sizes_is_refused_before_it_is_built(tmp_path):
    from draftsmith.draft.checkpoint import save_drafter
    from tests.helpers import make_tiny_drafter

    drafter = save_drafter(make_tiny_drafter(), tmp_path / "drafter")
    record = json.loads((drafter / "drafter.json").read_text())
    record["config"].update(hidden_size=1_000_000, intermediate_size=10_000_000)  # ~196 GB if built
    (drafter / "drafter.json").write_text(json.dumps(record))
    r = cli("export", drafter, "--out", tmp_path / "export")
    failed(r, 2, "drafter.json: its config describes a model of", "are not those of the weights")
    assert not (tmp_path / "export").exists()


def test_a_drafter_larger_than_memory_is_refused_before_it_is_built(tmp_path, dataset, tiny_target_dir, monkeypatch):
    import draftsmith.target as target_mod

    monkeypatch.setattr(target_mod, "available_memory", lambda device: 1 << 30)  # 1 GiB free
    args = tiny_train_args(dataset, tiny_target_dir, tmp_path / "run", "--steps", "1", "--intermediate-size", "100000x")
    failed(cli(*args), 2, "the drafter needs", "lower --intermediate-size")
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
@pytest.mark.parametrize("limit_gb", [0.7, 1.0])
@pytest.mark.parametrize("command", ["prepare", "extract", "train"])
def test_an_address_space_limit_is_a_clean_error(tmp_path, dataset, tiny_target_dir, command, limit_gb):
    """Under `ulimit -v` the commands that load PyTorch and a target end in an error that names the
    limit (exit 2), not a traceback or an abort in a library that could not map its memory."""
    import resource
    import subprocess
    import sys

    limit = int(limit_gb * 1e9)
    out = tmp_path / "out"
    args = {
        "prepare": ["prepare", dataset.parent / "chats.jsonl", "--target", tiny_target_dir, "--out", out],
        "extract": ["extract", dataset, "--target", tiny_target_dir, "--device", "cpu", "--out", out],
        "train": tiny_train_args(dataset, tiny_target_dir, out, "--steps", "1"),
    }[command]
    r = subprocess.run(
        [sys.executable, "-m", "draftsmith", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit)),
    )
    assert r.returncode == 2 and "address-space limit (`ulimit -v`)" in r.stderr, r.stderr[-2000:]
    assert "Traceback" not in r.stderr and "ABORT" not in r.stderr


# -- 10. misleading messages -----------------------------------------------------------------------


def test_a_target_with_an_auto_map_of_a_known_type_says_which_class_loads(tmp_path, tiny_target_dir):
    from draftsmith.target import load_target

    folder = shutil.copytree(tiny_target_dir, tmp_path / "t")
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "modeling_mine.MyLlama"}
    (folder / "config.json").write_text(json.dumps(config))
    import contextlib
    import io

    said = io.StringIO()
    with contextlib.redirect_stdout(said):
        load_target(str(folder), "cpu")
    assert "has an auto_map (code of its own), which draftsmith never runs" in said.getvalue()
    assert "transformers' own 'llama' class" in said.getvalue()


@pytest.mark.slow
def test_a_corrupt_gguf_copy_is_converted_again(tmp_path, monkeypatch):
    from draftsmith import gguf_cache
    from draftsmith.target import load_target, resolve_spec
    from tests.helpers import SMOLLM2

    if not SMOLLM2.startswith("smollm2"):
        pytest.skip("the embedded default's GGUF is not installed")
    monkeypatch.setenv("DRAFTSMITH_CACHE", str(tmp_path))
    load_target(SMOLLM2, "cpu", "fp32")  # converts and keeps a copy
    folder, name = resolve_spec(SMOLLM2)
    weights = gguf_cache.cached(folder / name, "model") / "model.safetensors"
    with weights.open("r+b") as f:
        f.truncate(weights.stat().st_size // 2)  # a disk fault, a copy cut short
    again = load_target(SMOLLM2, "cpu", "fp32")
    assert again.model is not None
    assert gguf_cache.cached(folder / name, "model") is not None and weights.stat().st_size > 0


def test_eval_help_and_a_checkpoint_agree(tmp_path, tiny_target_dir):
    """`eval --help` no longer offers checkpoints, and a checkpoint given is told what to pass."""
    assert "checkpoint" not in cli("eval", "--help").output
    step = tmp_path / "run" / "checkpoints" / "step_00000002"
    step.mkdir(parents=True)
    (step / "model.safetensors").write_bytes(b"")
    (step / "state.pt").write_bytes(b"")
    r = cli("eval", "--target", tiny_target_dir, "--drafter", step, "--out", tmp_path / "ev", "--device", "cpu")
    failed(r, 2, "is a training checkpoint", "give the training run's folder")


@pytest.mark.slow
def test_train_resume_from_another_folder_finds_the_runs_relative_paths(
    tmp_path, dataset, tiny_target_dir, monkeypatch
):
    """run.yaml records paths given relative to the folder the run started in as absolute ones,
    so that `--resume` from elsewhere reads the same target (an option it takes from the record)."""
    (tmp_path / "ds").symlink_to(dataset)
    (tmp_path / "target").symlink_to(tiny_target_dir)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path)
    assert cli(*tiny_train_args("ds", "target", "run", "--steps", "1")).exit_code == 0
    record = (tmp_path / "run" / "run.yaml").read_text()
    assert f"dataset_dir: {tmp_path / 'ds'}" in record and f"target: {tmp_path / 'target'}" in record
    again = cli(*tiny_train_args("ds", "target", "run", "--steps", "1", "--resume"))  # the same options, as given
    assert again.exit_code == 0 and "nothing to train" in again.output, again.output
    monkeypatch.chdir(tmp_path / "elsewhere")
    r = cli("train", tmp_path / "ds", "--out", "../run", "--resume")  # the target: the record's
    assert r.exit_code == 0 and "nothing to train" in r.output, r.output


# -- 2 and 1. a pipeline: every file it reads is an input of every stage ----------------------------


@pytest.mark.parametrize("victim", ["conversations", "recipe"])
def test_no_pipeline_stage_replaces_a_file_the_pipeline_reads(tmp_path, tiny_target_dir, victim):
    conv = tmp_path / "conv.jsonl"
    conv.write_text(json.dumps({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}))
    recipe = tmp_path / "p.yaml"
    target = conv if victim == "conversations" else recipe
    recipe.write_text(
        f"out: {tmp_path / 'run'}\ntarget: {tiny_target_dir}\nstages:\n"
        f"  - prepare: {{data: {conv}}}\n  - vocab: {{out: {target}, overwrite: true}}\n"
    )
    before = target.read_bytes()
    failed(cli("pipeline", recipe), 2, "pipeline stage vocab", "this command's input")
    assert target.read_bytes() == before and not (tmp_path / "run" / "prepare").exists()


@pytest.mark.parametrize("command", ["prepare", "extract"])
def test_running_out_of_memory_is_a_clean_error(tmp_path, dataset, tiny_target_dir, monkeypatch, command):
    import draftsmith.data.prepare as prepare_mod
    import draftsmith.extract.run as extract_mod

    def oom(*args, **kwargs):
        raise MemoryError  # as under `ulimit -v`

    if command == "prepare":
        monkeypatch.setattr(prepare_mod, "write_dataset", oom)
        conv = tmp_path / "c.jsonl"
        conv.write_text(json.dumps({"messages": [{"role": "user", "content": "a"}]}) + "\n")
        failed(cli("prepare", conv, "--target", tiny_target_dir, "--out", tmp_path / "ds"), 2, "out of memory")
        assert not (tmp_path / "ds").exists() and [p.name for p in tmp_path.iterdir()] == ["c.jsonl"]
    else:
        monkeypatch.setattr(extract_mod, "extract_samples", oom)
        r = cli("extract", dataset, "--target", tiny_target_dir, "--out", tmp_path / "store", "--device", "cpu")
        failed(r, 2, "extract ran out of memory", "--token-budget", "rerun the same command to resume")
