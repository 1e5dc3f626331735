"""`extract` on a tiny local target: stored tensors equal a plain HF forward, validation and its
error budget, preflight, disk full (injected ENOSPC) and resume."""

import errno
import json

import numpy as np
import pytest
import torch

import draftsmith.data.store as store_mod
import draftsmith.extract.run as extract_run
import draftsmith.extract.writer as writer_mod
from draftsmith.data.store import StoreReader, read_manifest
from draftsmith.errors import StageFailed, UserError
from draftsmith.extract.config import ExtractConfig
from draftsmith.extract.run import run
from tests.helpers import make_tiny_llama, write_tokenized_dataset


def random_samples(n, lo=3, hi=40, seed=0, vocab=49152):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, size=int(rng.integers(lo, hi))).tolist() for _ in range(n)]


@pytest.fixture
def dataset(tmp_path):
    return write_tokenized_dataset(tmp_path / "ds", random_samples(12))


def cfg(dataset, target, out, **kw):
    return ExtractConfig(
        dataset_dir=dataset, target=str(target), out=out, device="cpu", token_budget=128, writers=2, **kw
    )


@pytest.mark.slow
def test_store_equals_hf_forward(dataset, tiny_target_dir, tiny_model, tmp_path):
    out = run(cfg(dataset, tiny_target_dir, tmp_path / "store", check_every=5))
    reader = StoreReader(out)
    assert reader.meta["aux_layer_ids"] == [0, 1, 2] and reader.meta["complete"] and len(reader) == 12
    assert reader.meta["totals"]["tokens"] == int(reader.lengths.sum())
    H = tiny_model.config.hidden_size
    for i in range(len(reader)):
        reader.verify(i)
        s = reader[i]
        ref = tiny_model(s["input_ids"][None], output_hidden_states=True).hidden_states  # L+1 x [1, T, H]
        torch.testing.assert_close(s["aux_hidden_states"][:, :H], ref[0][0])
        torch.testing.assert_close(s["aux_hidden_states"][:, H : 2 * H], ref[1][0])
        torch.testing.assert_close(s["final_hidden_states"], ref[-1][0])  # after the final norm
    # a rerun has nothing to do and rewrites nothing
    mtimes = {p: p.stat().st_mtime_ns for p in out.glob("rows_*/*.safetensors")}
    run(cfg(dataset, tiny_target_dir, out))
    assert {p: p.stat().st_mtime_ns for p in out.glob("rows_*/*.safetensors")} == mtimes


@pytest.mark.slow
def test_a_store_of_an_older_version_still_opens(dataset, tiny_target_dir, tmp_path):
    """Stores written before the rename call the aux layer ids "layers" in store.json: they are
    read, trained from and resumed; the next extraction rewrites the key."""
    from draftsmith.data.dataset import load_dataset
    from draftsmith.target import load_target
    from draftsmith.train.config import TrainConfig
    from draftsmith.train.run import build_source

    out = run(cfg(dataset, tiny_target_dir, tmp_path / "store"))
    meta = json.loads((out / "store.json").read_text())
    meta["layers"] = meta.pop("aux_layer_ids")
    (out / "store.json").write_text(json.dumps(meta))
    reader = StoreReader(out)
    assert reader.meta["aux_layer_ids"] == [0, 1, 2] and "layers" not in reader.meta and len(reader) == 12
    train_cfg = TrainConfig(dataset_dir=dataset, out=tmp_path / "train", hidden=out)
    target = load_target(str(tiny_target_dir), "cpu", "fp32")
    assert build_source(train_cfg, target, load_dataset(dataset))[1] == [0, 1, 2]  # checked and read as train does
    run(cfg(dataset, tiny_target_dir, out))  # the same run again: not refused as another run's store
    written = json.loads((out / "store.json").read_text())
    assert written["aux_layer_ids"] == [0, 1, 2] and "layers" not in written


@pytest.mark.slow
def test_a_fine_tune_of_the_same_shapes_is_another_target(dataset, tiny_target_dir, tmp_path):
    """Weights of the same names, sizes and config (a fine-tune saved like its base) are another
    target: extract refuses to resume the base's store with them, and train to read it. A store
    recorded before fingerprints read the weights (its fingerprint: the shape part alone) still
    resumes and trains with the target of its shapes."""
    import shutil

    from transformers import LlamaForCausalLM

    from draftsmith.data.dataset import load_dataset
    from draftsmith.data.store import check_store_matches
    from draftsmith.target import load_target

    tuned = tmp_path / "tuned"
    shutil.copytree(tiny_target_dir, tuned)
    model = LlamaForCausalLM.from_pretrained(tuned)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01)
    model.save_pretrained(tuned)  # (tests/unit/test_target.py: a change to some of the weights)
    base, other = (load_target(str(t), "cpu", "fp32").info for t in (tiny_target_dir, tuned))
    assert base.fingerprint.split(".")[0] == other.fingerprint.split(".")[0]  # the same shapes
    assert base.fingerprint != other.fingerprint
    out = run(cfg(dataset, tiny_target_dir, tmp_path / "store"))
    with pytest.raises(UserError, match=r"target fingerprint: store made for .*refusing to mix"):
        run(cfg(dataset, tuned, out))
    with pytest.raises(UserError, match="target fingerprint"):
        check_store_matches(out, load_dataset(dataset), other)
    meta = json.loads((out / "store.json").read_text())
    meta["target"]["fingerprint"] = meta["target"]["fingerprint"].split(".")[0]  # as recorded before
    (out / "store.json").write_text(json.dumps(meta))
    check_store_matches(out, load_dataset(dataset), base)
    run(cfg(dataset, tiny_target_dir, out))  # resumed, not refused
    reader = StoreReader(out)
    for i in range(len(reader)):
        reader.verify(i)  # the files' own (full) fingerprints agree with store.json's shape part


@pytest.mark.slow
def test_refuses_to_mix_aux_layer_ids(dataset, tmp_path, tokenizer):
    target = tmp_path / "five-layers"  # room for two sets of three ids the engines capture (1..4)
    make_tiny_llama(len(tokenizer), num_layers=5).save_pretrained(target)
    tokenizer.save_pretrained(target)
    out = tmp_path / "store"
    run(cfg(dataset, target, out, aux_layer_ids=[1, 2, 3]))
    with pytest.raises(UserError, match="refusing to mix"):
        run(cfg(dataset, target, out, aux_layer_ids=[1, 2, 4]))
    same_counts = [[t + 1 for t in s] for s in random_samples(12)]  # other tokens, same lengths
    with pytest.raises(UserError, match="dataset fingerprint: store made from .*refusing to mix"):
        run(cfg(write_tokenized_dataset(tmp_path / "ds2", same_counts), target, out, aux_layer_ids=[1, 2, 3]))
    with pytest.raises(UserError, match="out of range.*1..4"):
        run(cfg(dataset, target, tmp_path / "other", aux_layer_ids=[1, 2, 5]))
    assert not (tmp_path / "other").exists()


@pytest.mark.slow
def test_error_budget_stops_and_keeps_valid(dataset, tiny_target_dir, tmp_path, monkeypatch):
    real_capture = extract_run.capture
    calls = {"n": 0}

    def flaky_capture(model, ids, mask, aux_layer_ids):
        aux, final = real_capture(model, ids, mask, aux_layer_ids)
        calls["n"] += 1
        if calls["n"] >= 3:  # from the third batch on, one NaN per batch
            aux = aux.clone()
            aux[0, 0, 0] = float("nan")
        return aux, final

    monkeypatch.setattr(extract_run, "capture", flaky_capture)
    out = tmp_path / "store"
    with pytest.raises(StageFailed, match="exceed --max-errors 1"):
        run(cfg(dataset, tiny_target_dir, out, max_errors=1, check_every=0).model_copy(update={"token_budget": 48}))
    kept = StoreReader(out)
    assert 0 < len(kept) < 12
    for i in range(len(kept)):
        kept.verify(i)
    monkeypatch.setattr(extract_run, "capture", real_capture)
    assert len(StoreReader(run(cfg(dataset, tiny_target_dir, out)))) == 12


def test_recheck_catches_batched_mismatch(dataset, tiny_target_dir, tmp_path, monkeypatch):
    real_capture = extract_run.capture

    def wrong_when_batched(model, ids, mask, aux_layer_ids):
        aux, final = real_capture(model, ids, mask, aux_layer_ids)
        return (aux * 1.1, final) if mask is not None else (aux, final)

    monkeypatch.setattr(extract_run, "capture", wrong_when_batched)
    with pytest.raises(StageFailed, match="re-check"):
        run(cfg(dataset, tiny_target_dir, tmp_path / "store", check_every=1, max_errors=0))


def fill_disk_after(monkeypatch, n):
    """The store writer's file placement fails with ENOSPC after `n` files; returns the real one."""
    real_place = writer_mod.place_file
    written = {"n": 0}

    def place_until_full(dest, data, staging):
        if written["n"] >= n:
            raise OSError(errno.ENOSPC, "No space left on device")
        written["n"] += 1
        real_place(dest, data, staging)

    monkeypatch.setattr(writer_mod, "place_file", place_until_full)
    return real_place


@pytest.mark.slow
def test_preflight_refuses_then_force_and_disk_full_resume(dataset, tiny_target_dir, tmp_path, monkeypatch):
    out = tmp_path / "store"
    monkeypatch.setattr(store_mod, "free_bytes", lambda p: 1000)
    with pytest.raises(UserError, match="not enough disk"):
        run(cfg(dataset, tiny_target_dir, out))
    real_place = fill_disk_after(monkeypatch, 5)
    with pytest.raises(StageFailed, match="disk full"):
        run(cfg(dataset, tiny_target_dir, out, force=True))
    assert len(read_manifest(out)) == 5
    monkeypatch.setattr(writer_mod, "place_file", real_place)  # space freed
    reader = StoreReader(run(cfg(dataset, tiny_target_dir, out, force=True)))
    assert len(reader) == 12 and reader.meta["complete"]


@pytest.mark.slow
def test_a_rerun_after_disk_full_needs_only_the_remainder(dataset, tiny_target_dir, tmp_path, monkeypatch):
    """Issue 16 item 12: after a disk-full stop, rerunning the same command asks room for the
    samples still to extract (plus a margin that scales with them), not a fixed 64 MB."""
    out = tmp_path / "store"
    monkeypatch.setattr(store_mod, "free_bytes", lambda p: 2 << 20)  # 2 MiB: holds this ~0.2 MB store
    real_place = fill_disk_after(monkeypatch, 5)
    with pytest.raises(StageFailed, match="disk full.*rerun the same command"):
        run(cfg(dataset, tiny_target_dir, out))
    monkeypatch.setattr(writer_mod, "place_file", real_place)
    monkeypatch.setattr(store_mod, "free_bytes", lambda p: 1000)  # still full
    with pytest.raises(
        UserError,
        match=r"the 7 samples still to extract need ~.* and .* has 1.0 KB free; "
        r"the 5 samples already in the store are kept\. Free at least",
    ):
        run(cfg(dataset, tiny_target_dir, out))
    monkeypatch.setattr(store_mod, "free_bytes", lambda p: 2 << 20)  # space freed
    assert len(StoreReader(run(cfg(dataset, tiny_target_dir, out)))) == 12


def test_staging_dir(dataset, tiny_target_dir, tmp_path):
    staging = tmp_path / "shm"
    reader = StoreReader(run(cfg(dataset, tiny_target_dir, tmp_path / "store", staging_dir=staging)))
    assert len(reader) == 12
    for i in range(len(reader)):
        reader.verify(i)
    assert list(staging.iterdir()) == []  # everything was moved into the store


@pytest.mark.slow
def test_a_corrupt_sample_is_refused_then_extracted_again(dataset, tiny_target_dir, tmp_path):
    """The reader refuses a sample whose bytes changed and says to delete it and rerun extract;
    that rerun extracts it again and lists it once."""
    from tests.helpers import flip_tail

    out = run(cfg(dataset, tiny_target_dir, tmp_path / "store"))
    reader = StoreReader(out)
    i = int(reader.lengths.argmax())
    expected, f = reader[i], reader.file(i)
    flip_tail(f)
    with pytest.raises(UserError, match="is corrupt.*delete the file and rerun the same `draftsmith extract`"):
        StoreReader(out)[i]
    f.unlink()
    run(cfg(dataset, tiny_target_dir, out))
    reader = StoreReader(out)
    assert reader.meta["complete"] and len(reader) == 12
    torch.testing.assert_close(reader[i]["aux_hidden_states"], expected["aux_hidden_states"])
    listed = [json.loads(line)["sample_id"] for line in (out / "manifest.jsonl").read_text().splitlines()]
    assert sorted(listed) == list(range(12))


@pytest.mark.slow
def test_a_second_extract_into_a_locked_folder_is_refused(dataset, tiny_target_dir, tmp_path):
    import os

    from draftsmith.fsutil import output_lock

    out = tmp_path / "store"
    with output_lock(out):  # another extraction is writing here
        with pytest.raises(UserError, match=rf"being written by another draftsmith process \(pid {os.getpid()}\)"):
            run(cfg(dataset, tiny_target_dir, out))
    assert not (out / "store.json").exists()
    run(cfg(dataset, tiny_target_dir, out))
    assert len(StoreReader(out)) == 12
