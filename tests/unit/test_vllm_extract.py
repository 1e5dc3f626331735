"""`extract --engine vllm` without vLLM: the layer ids asked for, the clear error without the
extra, the GGUF refusal, the defaults handed to the worker, and the store side of the protocol
with a stand-in worker that writes request files as vLLM's connector does (`hidden_states
[T, n_slots, H]`, `token_ids [T]`, a `.lock`): the files become a store equal to hook
capture's, and a file whose token ids differ from the dataset stops the run,
naming the sample, with nothing of it written and no request file left; the same command then
resumes."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from draftsmith.data.dataset import load_dataset
from draftsmith.data.store import StoreReader
from draftsmith.errors import StageFailed
from draftsmith.extract import vllm_capture
from draftsmith.extract.config import ExtractConfig
from draftsmith.extract.run import run as extract
from draftsmith.layers import engine_capture_ids
from tests.helpers import write_tokenized_dataset

# A stand-in for vllm_worker: for each row, the tiny target's own hidden states at the spec's
# layer ids (transformers' output_hidden_states, id L before the final norm) in vLLM's file
# layout; with BAD_ROW set, that row's file holds one token id changed.
FAKE_WORKER = textwrap.dedent("""
    import fcntl, json, os, sys, torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM
    from draftsmith.data.dataset import load_dataset
    spec = json.load(open(sys.argv[1]))
    bad = int(os.environ.get("BAD_ROW", "-1"))
    model = AutoModelForCausalLM.from_pretrained(spec["model"], dtype=torch.float32).eval()
    ds = load_dataset(spec["dataset"])
    for r in spec["rows"]:
        ids = torch.tensor(ds.ids[ds.offsets[r]:ds.offsets[r + 1]], dtype=torch.long)
        with torch.no_grad():
            out = model.model(ids[None], output_hidden_states=True)
        pre_norm = list(out.hidden_states[:-1]) + [None]
        with torch.no_grad():  # HF's last entry is after the final norm; vLLM's id L is before it
            hook = model.model.norm.register_forward_pre_hook(lambda m, a: pre_norm.__setitem__(-1, a[0]))
            model.model(ids[None])
            hook.remove()
        states = torch.stack([pre_norm[k][0] for k in spec["layer_ids"]], dim=1)  # [T, n_slots, H]
        token_ids = ids.clone()
        if r == bad:
            token_ids[3] += 1
        path = os.path.join(spec["request_dir"], f"{r}.safetensors")
        open(path + ".lock", "w").close()
        save_file({"hidden_states": states.contiguous(), "token_ids": token_ids}, path)
        print("@@draftsmith " + json.dumps({"row": r, "path": path, "cached": 0}), flush=True)
    print("@@draftsmith " + json.dumps({"done": True}), flush=True)
""")


def test_engine_capture_ids_add_the_last_layer_ascending():
    assert engine_capture_ids([2, 15, 27], 30, "vllm") == [2, 15, 27, 30]
    assert engine_capture_ids([27, 2, 15], 30, "vllm") == [2, 15, 27, 30]
    assert engine_capture_ids([0, 1, 2], 2, "vllm") == [0, 1, 2]  # a toy whose aux ids include L: asked once


def test_worker_spec_defaults(tmp_path, tiny_target_dir, monkeypatch):
    monkeypatch.setattr(vllm_capture, "require", lambda *a: "0.32.0")
    ds = write_tokenized_dataset(tmp_path / "ds", [[5, 6, 7], [8, 9]])
    cfg = ExtractConfig(dataset_dir=ds, target=str(tiny_target_dir), out=tmp_path / "out", engine="vllm", device="cpu")
    engine = vllm_capture.open_engine(cfg)
    assert engine.architectures == ["LlamaForCausalLM"] and engine.dtype == torch.float32
    spec = vllm_capture.worker_spec(cfg, engine, load_dataset(ds), [0, 1], [1, 2], tmp_path)
    assert spec["prefix_caching"] is False and spec["in_process"] and spec["max_model_len"] == 4
    assert spec["tensor_parallel_size"] == 1 and spec["expert_parallel"] is False


@pytest.fixture
def fake_worker(monkeypatch, tmp_path):
    """vllm_capture with the stand-in worker and without the vLLM check."""
    script = tmp_path / "fake_worker.py"
    script.write_text(FAKE_WORKER)

    def start(spec, out):
        path = out / vllm_capture.REQUESTS / "spec.json"
        path.write_text(vllm_capture.json.dumps(spec))
        return subprocess.Popen(
            [sys.executable, str(script), str(path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
        )

    monkeypatch.setattr(vllm_capture, "require", lambda *a: "0.32.0")
    monkeypatch.setattr(vllm_capture, "start_worker", start)


def dataset(tmp_path):
    g = torch.Generator().manual_seed(0)
    return write_tokenized_dataset(
        tmp_path / "ds", [torch.randint(3, 400, (n,), generator=g).tolist() for n in (9, 14, 6)]
    )


@pytest.mark.slow
def test_request_files_become_the_store(tmp_path, tiny_target_dir, fake_worker):
    common = dict(dataset_dir=dataset(tmp_path), target=str(tiny_target_dir), aux_layer_ids=[0, 1, 2], device="cpu")
    extract(ExtractConfig(out=tmp_path / "engine", engine="vllm", check_every=1, **common))  # every sample re-checked
    extract(ExtractConfig(out=tmp_path / "hooks", **common))
    got, ref = StoreReader(tmp_path / "engine"), StoreReader(tmp_path / "hooks")
    assert got.meta == ref.meta and got.meta["complete"] and not (tmp_path / "engine" / vllm_capture.REQUESTS).exists()
    for i in range(len(ref)):
        for key in (
            "input_ids",
            "loss_mask",
            "aux_hidden_states",
            "final_hidden_states",
        ):  # final: the norm applied here
            torch.testing.assert_close(got[i][key], ref[i][key])


@pytest.mark.slow
def test_a_token_mismatch_stops_the_run_naming_the_sample(tmp_path, tiny_target_dir, fake_worker, monkeypatch):
    monkeypatch.setenv("BAD_ROW", "1")
    out = tmp_path / "store"
    cfg = ExtractConfig(
        dataset_dir=dataset(tmp_path),
        target=str(tiny_target_dir),
        out=out,
        engine="vllm",
        aux_layer_ids=[0, 1, 2],
        device="cpu",
        check_every=0,
        engine_chunk=1,
    )
    with pytest.raises(
        StageFailed, match=r"sample 1: vLLM returned 14 rows for 14 token ids.*first difference at token 3"
    ):
        extract(cfg)
    assert StoreReader(out).sample_ids == [0]  # the sample before it is whole; nothing of sample 1 or after
    assert not list(out.glob("rows_*/1.safetensors")) and not (out / vllm_capture.REQUESTS).exists()

    first = (out / "rows_0-1999/0.safetensors").stat().st_mtime_ns
    monkeypatch.delenv("BAD_ROW")
    extract(cfg)  # the same command resumes: sample 0 is kept as it is, the rest is written
    reader = StoreReader(out)
    assert reader.sample_ids == [0, 1, 2] and reader.meta["complete"]
    assert (out / "rows_0-1999/0.safetensors").stat().st_mtime_ns == first


def test_check_request_refuses_missing_rows():
    ids = np.arange(5, dtype=np.int32)
    data = {"hidden_states": torch.zeros(4, 4, 8), "token_ids": torch.arange(4)}
    with pytest.raises(StageFailed, match="sample 7: vLLM returned 4 rows for 4 token ids, the dataset has 5 tokens"):
        vllm_capture.check_request(data, ids, 7, 4, 8)
    with pytest.raises(StageFailed, match="expected \\[5, 3, 8\\]"):
        vllm_capture.check_request({"hidden_states": torch.zeros(5, 4, 8), "token_ids": torch.arange(5)}, ids, 7, 3, 8)
