"""Issue 55's probes at the level of the functions that enforce them (fsutil's output rule, the
pipeline's stage names, fingerprints, the data checks): no model, no CLI, milliseconds each."""

from __future__ import annotations

import json
import os

import pytest

from draftsmith.errors import UserError
from draftsmith.fsutil import MADE_FILE, check_output, made_by, mark_output, same_file
from draftsmith.pipeline.run import parse_stages


def marked(folder, command):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / MADE_FILE).write_text(json.dumps({"command": command}))
    return folder


# -- 1. one ownership rule -------------------------------------------------------------------------


def test_no_command_rewrites_another_commands_marker(tmp_path):
    run = marked(tmp_path / "run", "train")
    with pytest.raises(UserError, match="output of `draftsmith train`"):
        mark_output(run, "extract")
    assert made_by(run) == "train"
    mark_output(run, "train")  # its own: fine


def test_inputs_are_compared_by_device_and_inode(tmp_path):
    src = tmp_path / "p.jsonl"
    src.write_text("{}\n")
    os.link(src, tmp_path / "hard.jsonl")
    assert same_file(src, tmp_path / "hard.jsonl") and not same_file(src, tmp_path / "gone")
    with pytest.raises(UserError, match="this command's input"):
        check_output(tmp_path / "hard.jsonl", "synth", [src], folder=False)


def test_a_file_out_inside_another_commands_folder_is_refused(tmp_path):
    ds = marked(tmp_path / "ds", "prepare")
    (ds / "data").mkdir()
    with pytest.raises(UserError, match="output of `draftsmith prepare`"):
        check_output(ds / "data" / "conversations.jsonl", "vocab", [], overwrite=True, folder=False)
    check_output(tmp_path / "elsewhere" / "vocab.safetensors", "vocab", [ds], folder=False)


@pytest.mark.parametrize("command", ["train", "extract"])
def test_train_and_extract_own_only_their_folders(tmp_path, command):
    legacy = {"train": "run.yaml", "extract": "store.json"}[command]
    hand = tmp_path / "hand"
    hand.mkdir()
    (hand / "notes.txt").write_text("x")
    for overwrite in (False, True):
        with pytest.raises(UserError, match="no .draftsmith marker"):
            check_output(hand, command, [], overwrite)
    other = marked(tmp_path / "other", "prepare")
    with pytest.raises(UserError, match="output of `draftsmith prepare`"):
        check_output(other, command, [])
    old = tmp_path / "old"  # made before outputs were marked: still its own
    old.mkdir()
    (old / legacy).write_text("x")
    check_output(old, command, [])
    check_output(marked(tmp_path / "own", command), command, [])


# -- pipeline stage names are plain names ----------------------------------------------------------


@pytest.mark.parametrize("name", ["../../escape", "a/b", "..", ".hidden", "", "a\\b"])
def test_a_pipeline_stage_name_must_be_plain(name):
    with pytest.raises(UserError, match="not a plain name"):
        parse_stages([{"prepare": {"name": name}}])
    assert parse_stages([{"prepare": {"name": "prep_2"}}])[0][0] == "prep_2"


# -- 2. no training on data that is not what it claims ---------------------------------------------


def tiny_dataset(path, samples, masks=None, target=None):
    from draftsmith.data.dataset import FORMAT, META_FILE, write_table

    path.mkdir(parents=True, exist_ok=True)
    write_table(
        path,
        {
            "sample_id": list(range(len(samples))),
            "input_ids": samples,
            "loss_mask": masks if masks is not None else [[1] * len(s) for s in samples],
            "length": [len(s) for s in samples],
        },
    )
    meta = {"format": FORMAT, "version": 1, "target": target or {}, "max_len": 2048}
    (path / META_FILE).write_text(json.dumps(meta))
    return path


def test_a_store_still_being_written_or_incomplete_is_refused_unless_accepted(tmp_path, capsys):
    from draftsmith.data.store import STORE_FILE, check_store_ready, new_store_meta
    from draftsmith.fsutil import atomic_write_json, output_lock

    store = tmp_path / "store"
    store.mkdir()
    meta = new_store_meta({"name": "t", "fingerprint": "f", "hidden_size": 8}, [0, 1, 2], "float32", {"samples": 20})
    atomic_write_json(store / STORE_FILE, meta)  # complete: False, as extract leaves it until the end
    with pytest.raises(UserError, match=r"is incomplete .* holds 0 of 20 samples.*--partial-store"):
        check_store_ready(store)
    check_store_ready(store, partial=True)
    assert "--partial-store" in capsys.readouterr().out
    atomic_write_json(store / STORE_FILE, {**meta, "complete": True})
    check_store_ready(store)
    with output_lock(store):  # extract writing into it
        with pytest.raises(UserError, match=rf"is being written by `draftsmith extract` \(pid {os.getpid()}\)"):
            check_store_ready(store)


def test_a_dataset_of_another_tokenizer_is_refused(tmp_path, tokenizer):
    from draftsmith.data.dataset import check_tokenizer, load_dataset, tokenizer_id

    ds = load_dataset(tiny_dataset(tmp_path / "ds", [[1, 2, 3]], target={"name": "other", "tokenizer": "0" * 16}))
    with pytest.raises(UserError, match="tokenized for target 'other', whose tokenizer is not --target mine's"):
        check_tokenizer(ds, tokenizer, "mine")
    ok = load_dataset(tiny_dataset(tmp_path / "ok", [[1, 2, 3]], target={"tokenizer": tokenizer_id(tokenizer)}))
    check_tokenizer(ok, tokenizer, "mine")
    check_tokenizer(load_dataset(tiny_dataset(tmp_path / "old", [[1, 2, 3]])), tokenizer, "mine")  # not recorded


def test_a_run_with_no_trainable_tokens_is_refused(tmp_path):
    from draftsmith.data.dataset import check_trainable, load_dataset, trainable_tokens

    ds = load_dataset(tiny_dataset(tmp_path / "zero", [[1, 2, 3, 4]] * 3, masks=[[0, 0, 0, 0]] * 3))
    with pytest.raises(UserError, match="loss masks are all zero.*--loss-tokens all"):
        check_trainable(ds, [0, 1, 2], 2048, 2, all_tokens=False)
    assert check_trainable(ds, [0, 1, 2], 2048, 2, all_tokens=True) == 6
    ds = load_dataset(tiny_dataset(tmp_path / "ok", [[1, 2, 3, 4], [5]], masks=[[0, 1, 1, 1], [1]]))
    assert trainable_tokens(ds, [0, 1], 2048, 2, False) == 2 and trainable_tokens(ds, [1], 2048, 2, False) == 0
    with pytest.raises(UserError, match="larger --batch-tokens"):  # --batch-tokens 1: rows of one token
        check_trainable(ds, [0, 1], 1, 2, all_tokens=False)


def test_epochs_is_bounded():
    from pydantic import ValidationError

    from draftsmith.train.config import TrainConfig

    with pytest.raises(ValidationError, match="less than or equal to 10000"):
        TrainConfig(dataset_dir="d", out="o", epochs=1e30)
    assert TrainConfig(dataset_dir="d", out="o", epochs=100).epochs == 100


# -- 8. a corrupt dataset is a clean error ---------------------------------------------------------


def test_a_dataset_whose_lengths_disagree_or_with_a_negative_id_is_refused(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from draftsmith.data.dataset import DATA_FILE, SCHEMA, load_dataset

    bad = tiny_dataset(tmp_path / "bad", [[1, 2, 3]])
    table = pa.table(
        {"sample_id": [0], "input_ids": [[1, 2, 3]], "loss_mask": [[1, 1, 1]], "length": [5]}, schema=SCHEMA
    )
    pq.write_table(table, bad / DATA_FILE)
    with pytest.raises(UserError, match=r"data.parquet: its lengths, input_ids and loss_mask disagree"):
        load_dataset(bad)
    with pytest.raises(UserError, match=r"data.parquet: holds a negative token id \(-4\)"):
        load_dataset(tiny_dataset(tmp_path / "neg", [[1, -4, 3]]))


# -- 5. content ids and fingerprints see a same-size fine-tune -------------------------------------


def test_a_same_size_edit_of_one_tensor_changes_the_content_id(tmp_path):
    import torch
    from safetensors.torch import save_file

    from draftsmith.fsutil import content_id, sampled_id

    tensors = {f"layer.{i:02d}": torch.randn(256, 256, generator=torch.Generator().manual_seed(i)) for i in range(20)}
    path = tmp_path / "model.safetensors"  # 5.2 MB: sampled_id reads 4 blocks of it
    save_file(tensors, path)
    before, size, old = content_id(path), path.stat().st_size, sampled_id(path)
    save_file({**tensors, "layer.07": tensors["layer.07"] * 1.01}, path)  # one layer fine-tuned, saved over it
    assert path.stat().st_size == size
    assert sampled_id(path) == old  # what the fingerprint read before issue 55: the edit fell between its blocks
    assert content_id(path) != before


def test_a_same_size_edit_of_a_large_text_file_changes_the_content_id(tmp_path):
    from draftsmith.fsutil import content_id

    path = tmp_path / "conv.jsonl"
    lines = [json.dumps({"messages": [{"role": "user", "content": f"question {i:06d}"}]}) for i in range(200_000)]
    path.write_text("\n".join(lines) + "\n")  # ~12 MB
    before = content_id(path)
    text = path.read_text()
    path.write_text(text.replace("question 123457", "question 754321"))
    assert content_id(path) != before


def test_a_target_fine_tuned_in_place_has_another_fingerprint(tmp_path, tiny_target_dir):
    import shutil

    from safetensors.torch import load_file, save_file

    from draftsmith.target import fingerprint, same_target

    folder = shutil.copytree(tiny_target_dir, tmp_path / "t")
    base = fingerprint(folder, None)
    weights = load_file(folder / "model.safetensors")
    name = next(k for k in sorted(weights) if "layers.1." in k and k.endswith("down_proj.weight"))
    size = (folder / "model.safetensors").stat().st_size
    save_file({**weights, name: weights[name] * 1.5}, folder / "model.safetensors", metadata={"format": "pt"})
    assert (folder / "model.safetensors").stat().st_size == size
    tuned = fingerprint(folder, None)
    assert not same_target(base, tuned) and not same_target(tuned, base)
    shape, sampled, _ = base.split(".")
    assert same_target(shape, base) and same_target(f"{shape}.{sampled}", base)  # records of earlier versions
    assert not same_target(f"{shape}.{'0' * 16}", base)


# -- 9. temporary folders of killed runs; status's advice ------------------------------------------


def test_the_next_run_removes_the_temporary_folders_of_killed_runs(tmp_path):
    from draftsmith.fsutil import LOCK_FILE, atomic_output_dir, output_lock

    out = tmp_path / "ds"
    killed = tmp_path / ".ds.abc.tmp"  # a killed run's: its build lock is free
    killed.mkdir()
    (killed / LOCK_FILE).write_text("999999\n")
    old = tmp_path / ".ds.xyz.tmp"  # an earlier draftsmith's (no lock), an hour old
    old.mkdir()
    os.utime(old, (0, 0))
    young = tmp_path / ".ds.new.tmp"  # a run just starting (no lock yet): kept
    young.mkdir()
    live = tmp_path / ".ds.live.tmp"  # a live run's (its lock is held: flock conflicts between open files): kept
    with output_lock(live):
        with atomic_output_dir(out, "prepare") as tmp:
            (tmp / "data").write_text("1")
            building = (tmp / LOCK_FILE).exists()
        assert live.exists()
    assert building and not killed.exists() and not old.exists() and young.exists()
    assert sorted(p.name for p in out.iterdir()) == [MADE_FILE, "data"]  # no build lock published


def test_status_of_a_dead_temporary_folder_offers_no_resume(tmp_path):
    import subprocess
    import sys

    from typer.testing import CliRunner

    from draftsmith.cli import app
    from draftsmith.progress import Progress

    work = tmp_path / ".ds.abc.tmp"
    work.mkdir()
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    with Progress("prepare", work, total=4, live=False) as p:
        p.advance(1)
        snap = p.snapshot()
    (work / "progress.json").write_text(json.dumps({**snap, "status": "running", "pid": gone.pid}))
    r = CliRunner().invoke(app, ["status", str(tmp_path / "ds")])
    text = " ".join(r.output.replace("│", " ").split())
    assert "removes it and starts over" in text and "left by a killed run" in text and "to resume" not in text, text


def test_status_says_dead_for_a_reused_pid(tmp_path):
    from typer.testing import CliRunner

    from draftsmith.cli import app
    from draftsmith.progress import Progress

    stage = tmp_path / "store"
    stage.mkdir()
    with Progress("extract", stage, total=10, live=False) as p:
        p.advance(3)
        snap = p.snapshot()
    start = snap["started_at"] - 86400 * 365  # a run of a year ago, whose pid this process now has
    snap.update(status="running", pid=os.getpid(), started_at=start, updated_at=start + 10)
    (stage / "progress.json").write_text(json.dumps(snap))
    text = " ".join(CliRunner().invoke(app, ["status", str(stage)]).output.replace("│", " ").split())
    assert f"dead (process gone, pid {os.getpid()} is another process now" in text, text


# -- 8 and 10. a binary --config; the layer-id error names the count --------------------------------


def test_a_binary_config_is_a_clean_error(tmp_path):
    from draftsmith.config import load_yaml_mapping

    path = tmp_path / "c.yaml"
    path.write_bytes(b"\xff\xfe\x00binary")
    with pytest.raises(UserError, match=r"c.yaml: not UTF-8 text"):
        load_yaml_mapping(path, "--config")


def test_the_layer_id_error_names_the_layer_count_not_a_letter():
    from draftsmith.layers import validate_layers

    with pytest.raises(UserError) as e:
        validate_layers([0, 5, 40], 30)
    assert "id 30 (the last layer's output)" in str(e.value) and "1..L" not in str(e.value)
    with pytest.raises(UserError, match="the target's layer count L is not recorded"):
        validate_layers([0, 5, 6], None)


def test_a_full_disk_while_publishing_names_the_output(tmp_path):
    import errno

    from draftsmith.errors import StageFailed
    from draftsmith.fsutil import atomic_output_dir

    out = tmp_path / "report"
    with pytest.raises(StageFailed, match=rf"^{out}: disk full"), atomic_output_dir(out, "eval"):
        raise OSError(errno.ENOSPC, "No space left on device")  # as a failed write() says it: no file
    assert not out.exists()


def test_a_binary_eval_report_is_a_clean_error(tmp_path):
    from draftsmith.export.run import read_report

    path = tmp_path / "report.json"
    path.write_bytes(b"\xff\xfe\x00binary")
    with pytest.raises(UserError, match=r"--eval-report .*report.json: cannot be read as JSON"):
        read_report(path)
