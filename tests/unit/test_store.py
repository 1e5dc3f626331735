"""The store format: folder paths, writer -> reader round trip, manifests, batching, bad stores."""

import json
import re

import numpy as np
import pytest
import torch

from draftsmith.data.store import (
    MANIFEST,
    STORE_FILE,
    StoreReader,
    length_batches,
    new_store_meta,
    read_manifest,
    sample_relpath,
)
from draftsmith.errors import UserError
from draftsmith.extract.writer import HostBuffers, StoreWriter, clean_orphans
from draftsmith.fsutil import atomic_write_json
from tests.helpers import flip_tail

H, N_AUX = 8, 3


def write_fake_store(out, lengths, sample_ids=None, dtype=torch.bfloat16):
    """A store of random tensors written through StoreWriter; returns the per-sample tensors."""
    sample_ids = sample_ids or list(range(len(lengths)))
    target = {"name": "fake", "fingerprint": "abc", "hidden_size": H, "num_layers": 4}
    atomic_write_json(out / STORE_FILE, new_store_meta(target, [0, 2, 4], "bfloat16", {"samples": len(lengths)}))
    g = torch.Generator().manual_seed(0)
    samples, aux, final = [], [], []
    for sid, T in zip(sample_ids, lengths):
        samples.append((sid, np.arange(T, dtype=np.int32), (np.arange(T) % 2).astype(np.uint8)))
        aux.append(torch.randn(T, N_AUX * H, generator=g).to(dtype))
        final.append(torch.randn(T, H, generator=g).to(dtype))
    aux_all, final_all = torch.cat(aux), torch.cat(final)  # [N, n_aux*H], [N, H]
    buffers = HostBuffers(2, torch.device("cpu"))
    w = StoreWriter(out, out / MANIFEST, {"fingerprint": "abc"}, N_AUX, H, buffers, threads=2)
    w.submit(
        samples,
        {"aux": aux_all, "final": final_all, "finite": torch.ones(len(aux_all), dtype=torch.bool)},
        None,
        buffers.acquire(),
    )
    results = w.drain()
    w.close()
    return samples, aux, final, results


def test_sample_relpath_folders():
    assert sample_relpath(0) == "rows_0-1999/0.safetensors"
    assert sample_relpath(1999) == "rows_0-1999/1999.safetensors"
    assert sample_relpath(2000) == "rows_2000-3999/2000.safetensors"
    assert sample_relpath(5, folder_size=4) == "rows_4-7/5.safetensors"


def test_round_trip(tmp_path):
    samples, aux, final, results = write_fake_store(tmp_path, [5, 3, 9], sample_ids=[7, 2001, 3])
    assert sum(r.samples for r in results) == 3 and not results[0].errors
    reader = StoreReader(tmp_path)
    assert reader.sample_ids == [3, 7, 2001]
    assert reader.lengths.tolist() == [9, 5, 3]
    assert (tmp_path / "rows_2000-3999" / "2001.safetensors").exists()
    s = reader.get(7)
    assert s["input_ids"].dtype == torch.long and s["input_ids"].tolist() == list(range(5))
    assert s["loss_mask"].dtype == torch.long
    assert torch.equal(s["aux_hidden_states"], aux[0]) and torch.equal(s["final_hidden_states"], final[0])
    for i in range(len(reader)):
        reader.verify(i)
    with pytest.raises(KeyError):
        reader.get(4)


def test_nonfinite_rows_are_counted_not_written(tmp_path):
    target = {"name": "fake", "fingerprint": "abc", "hidden_size": H}
    atomic_write_json(tmp_path / STORE_FILE, new_store_meta(target, [0, 2, 4], "float32", {}))
    buffers = HostBuffers(1, torch.device("cpu"))
    w = StoreWriter(tmp_path, tmp_path / MANIFEST, {}, N_AUX, H, buffers, threads=1)
    finite = torch.ones(7, dtype=torch.bool)
    finite[5] = False  # second sample, its third token
    samples = [(0, np.zeros(3, np.int32), np.zeros(3, np.uint8)), (1, np.zeros(4, np.int32), np.zeros(4, np.uint8))]
    w.submit(
        samples,
        {"aux": torch.zeros(7, N_AUX * H), "final": torch.zeros(7, H), "finite": finite},
        None,
        buffers.acquire(),
    )
    (result,) = w.drain()
    assert result.samples == 1 and len(result.errors) == 1 and "sample 1" in result.errors[0]
    assert StoreReader(tmp_path).sample_ids == [0]


def test_manifest_dedup_and_torn_line(tmp_path):
    write_fake_store(tmp_path, [4, 4])
    line = (tmp_path / MANIFEST).read_text().splitlines()[0]
    (tmp_path / "manifest.rank1.jsonl").write_text(line + "\n")  # listed twice: counts once
    with open(tmp_path / MANIFEST, "a") as f:
        f.write('{"sample_id": 9, "pa')  # torn append from a kill
    assert sorted(read_manifest(tmp_path)) == [0, 1]
    assert len(StoreReader(tmp_path)) == 2


def test_clean_orphans(tmp_path):
    write_fake_store(tmp_path, [4, 4])
    folder = tmp_path / "rows_0-1999"
    (folder / "5.safetensors").write_bytes(b"renamed but never listed")
    (folder / ".6.safetensors.abc.tmp").write_bytes(b"partial")
    listed = {e["path"] for e in read_manifest(tmp_path).values()}
    assert clean_orphans(tmp_path, listed) == 2
    assert sorted(p.name for p in folder.iterdir()) == ["0.safetensors", "1.safetensors"]


def test_not_a_store(tmp_path):
    with pytest.raises(UserError, match="not a hidden-state store"):
        StoreReader(tmp_path)
    (tmp_path / STORE_FILE).write_text(json.dumps({"format": "other"}))
    with pytest.raises(UserError, match="not a draftsmith hidden-state store"):
        StoreReader(tmp_path)


def test_corrupt_file_detected(tmp_path):
    write_fake_store(tmp_path, [6])
    f = tmp_path / "rows_0-1999" / "0.safetensors"
    data = bytearray(f.read_bytes())
    data[-1] ^= 0xFF
    f.write_bytes(bytes(data))
    with pytest.raises(UserError, match="checksum"):
        StoreReader(tmp_path).verify(0)


def test_every_read_verifies_the_checksum(tmp_path):
    """4 KB of flipped tensor bytes still load as tensors: the read itself must refuse them,
    naming the file and how to extract it again."""
    write_fake_store(tmp_path, [100, 5])  # sample 0: 6.9 KB of tensor data
    reader = StoreReader(tmp_path)
    flip_tail(reader.file(0))
    with pytest.raises(
        UserError, match=re.escape(f"{reader.file(0)}: sample 0 is corrupt") + ".*delete the file and rerun"
    ):
        reader[0]
    assert reader[1]["input_ids"].tolist() == list(range(5))
    reader.file(1).unlink()
    with pytest.raises(UserError, match=re.escape(f"{reader.file(1)}: cannot read sample 1") + ".*rerun the same"):
        reader[1]


def test_length_batches_respects_budget():
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 300, size=500)
    batches = length_batches(lengths, token_budget=1024, shuffle=True, seed=1)
    flat = sorted(i for b in batches for i in b)
    assert flat == list(range(500))
    for b in batches:
        assert len(b) * lengths[b].max() <= 1024
    assert length_batches([5000, 3], token_budget=100) == [[1], [0]]  # a long sample gets its own batch
    assert length_batches(lengths, 1024, shuffle=True, seed=1) == batches  # deterministic


def test_repair_manifest_cuts_torn_line(tmp_path):
    from draftsmith.data.store import repair_manifest

    m = tmp_path / MANIFEST
    m.write_text('{"sample_id": 0, "tokens": 3}\n{"sample_id": 1, "tok')
    repair_manifest(m)
    assert m.read_text() == '{"sample_id": 0, "tokens": 3}\n'
    m.write_text('{"sample_id": 1, "tok')
    repair_manifest(m)
    assert m.read_text() == ""


def test_reader_owns_its_bytes(tmp_path):
    """A sample is read whole when it is loaded, not mapped: a file rewritten afterwards (say, by a
    resumed extract) cannot change tensors already handed to training, and the I/O happens in
    the thread that called the reader (the training prefetch)."""
    _, aux, _, _ = write_fake_store(tmp_path, [6])
    reader = StoreReader(tmp_path)
    s = reader[0]
    f = reader.file(0)
    f.write_bytes(f.read_bytes()[:-16] + bytes(16))  # the tail of the file (final states) zeroed
    assert torch.equal(s["aux_hidden_states"], aux[0])
    assert s["final_hidden_states"][-1].abs().sum() > 0


def test_offline_source_reads_a_row_in_order(tmp_path):
    """The parallel row read returns samples in the row's order, truncated to max_len."""
    from draftsmith.train.batching import OfflineSource

    _, aux, _, _ = write_fake_store(tmp_path, [5, 3, 9, 4], sample_ids=[0, 1, 2, 3])
    src = OfflineSource(StoreReader(tmp_path), max_len=6)
    out = src.samples([2, 0, 3, 1])
    assert [s["input_ids"].shape[0] for s in out] == [6, 5, 4, 3]
    assert torch.equal(out[0]["aux"], aux[2][:6]) and torch.equal(out[3]["aux"], aux[1])


@pytest.mark.slow
def test_check_store_matches_its_dataset_and_target(tmp_path, tiny_target):
    """A store is for the dataset (by content, wherever it lies) and the target it was made from."""
    import dataclasses
    import shutil

    from draftsmith.data.dataset import load_dataset
    from draftsmith.data.store import check_store_matches, dataset_identity
    from tests.helpers import write_tokenized_dataset

    ds = write_tokenized_dataset(tmp_path / "ds", [[5, 6, 7], [8, 9]])
    other = load_dataset(write_tokenized_dataset(tmp_path / "other", [[5, 6, 7], [8, 10]]))  # same counts
    store, info = tmp_path / "store", tiny_target.info
    atomic_write_json(
        store / STORE_FILE, new_store_meta(info.to_dict(), [0, 1, 2], "float32", dataset_identity(load_dataset(ds)))
    )
    check_store_matches(store, load_dataset(shutil.copytree(ds, tmp_path / "copy")), info)
    with pytest.raises(
        UserError, match=rf"not made from the dataset {other.path}.*dataset fingerprint: store made from"
    ):
        check_store_matches(store, other, info)
    with pytest.raises(
        UserError,
        match=r"target fingerprint: store made for 'tiny-llama' \(in-memory\), this run has 'tiny-llama' \(x\)",
    ):
        check_store_matches(store, load_dataset(ds), dataclasses.replace(info, fingerprint="x"))
    # a store made before datasets were fingerprinted is checked on its sample and token counts
    atomic_write_json(
        store / STORE_FILE, new_store_meta(info.to_dict(), [0, 1, 2], "float32", {"samples": 2, "tokens": 5})
    )
    check_store_matches(store, other, info)
    with pytest.raises(UserError, match="dataset tokens: store made from 5, this run has 4"):
        check_store_matches(store, load_dataset(write_tokenized_dataset(tmp_path / "short", [[5, 6, 7], [8]])), info)
    # a store captured at layers no engine serves (written before the layer rule) is refused for training; how
    # many layers it holds is the method's to check (EAGLE-3 three, DFlash any: tests/unit/test_paper_settings.py)
    atomic_write_json(
        store / STORE_FILE, new_store_meta(info.to_dict(), [0, 1, 5], "float32", dataset_identity(load_dataset(ds)))
    )
    with pytest.raises(UserError, match=r"store .*: layer ids \[5\] are out of range.*extract a new store"):
        check_store_matches(store, load_dataset(ds), info)
