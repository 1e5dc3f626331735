"""`extract --engine vllm`: the store filled from vLLM's own forward of the target.

`open_engine` checks that vLLM is installed, finds the HF folder vLLM loads, and describes the
target from its config on the meta device (no weights), loading only its final norm.
`capture_samples` starts the worker (`vllm_worker`: vLLM's `LLM` must be built under `__main__`,
in its own process) and turns each request file it reports into a store sample, through the
same `StoreWriter` as transformers capture:

- the ids asked for are draftsmith's aux layer ids converted here (`layers`), plus id L, the last
  layer's output before the final norm; slot j of a file holds the j-th id, ascending;
- a file whose token ids or row count differ from the dataset's sample stops the run, naming it;
- aux [T, n_aux*H] is the aux slots side by side; final [T, H] the target's final norm of slot L;
- every `--check-every` samples (and the first) one is compared with a reference forward of the
  target loaded here (transformers, `--device`/`--shard`); a difference stops the run;
- request files are deleted once written; `OUT/.vllm-requests` is removed at a run's start and end.
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from draftsmith.data.dataset import TokenizedDataset
from draftsmith.errors import StageFailed, UserError
from draftsmith.extract.config import ExtractConfig
from draftsmith.extract.recheck import recheck
from draftsmith.extract.vllm_worker import MARK
from draftsmith.extract.writer import HostBuffers, StoreWriter
from draftsmith.fsutil import fsync_dir
from draftsmith.layers import engine_capture_ids, to_engine
from draftsmith.progress import Progress
from draftsmith.target import (
    TargetInfo,
    default_device,
    describe,
    final_norm,
    hf_folder,
    load_target,
    parse_dtype,
    resolve_spec,
    text_config,
)
from draftsmith.torchrun import dist_env
from draftsmith.vllm_support import exit_reason, kv_cache_bytes, require

REQUESTS = ".vllm-requests"  # vLLM's request files, inside the store's folder (same disk), removed after use
VLLM_DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
HOST_SLOTS = 3


@dataclass
class EngineTarget:
    """What the parent process knows of a target vLLM runs: its identity, the folder vLLM
    loads, its dtype and its own final norm (weights loaded, on the CPU)."""

    info: TargetInfo
    folder: Path
    architectures: list[str]
    dtype: torch.dtype
    norm: torch.nn.Module
    text_config: Any  # the target's (text) config: its KV cache size


def read_tensors(folder: Path, names: list[str]) -> dict[str, torch.Tensor]:
    """The named tensors of a safetensors checkpoint folder (sharded or not), read alone."""
    index = folder / "model.safetensors.index.json"
    if index.exists():
        where = json.loads(index.read_text())["weight_map"]
        files = {n: folder / where[n] for n in names if n in where}
    else:
        files = {}
        for f in sorted(folder.glob("*.safetensors")):
            with safe_open(str(f), "pt") as st:
                files.update({n: f for n in names if n in st.keys()})
    missing = [n for n in names if n not in files]
    if missing:
        raise UserError(
            f"{folder}: no tensor {missing[0]!r} in its safetensors files; --engine vllm reads the final "
            "norm's weights from the checkpoint by their transformers names"
        )
    out = {}
    for n, f in files.items():
        with safe_open(str(f), "pt") as st:
            out[n] = st.get_tensor(n)
    return out


def open_engine(cfg: ExtractConfig) -> EngineTarget:
    """Check the run can go to vLLM and describe its target without loading its weights."""
    from transformers import AutoConfig, AutoModelForCausalLM

    require("extract --engine vllm", "--engine transformers")
    if dist_env().world > 1:
        raise UserError(
            "--engine vllm runs one vLLM engine, which spreads the target over GPUs itself "
            "(--tensor-parallel-size, --expert-parallel); run it without torchrun"
        )
    if cfg.shard != "none":
        raise UserError(
            "--engine vllm splits the target with --tensor-parallel-size; --shard is for --engine transformers"
        )
    folder = hf_folder(cfg.target, "--engine vllm")  # a GGUF: its float32 copy
    dtype = parse_dtype(cfg.dtype, torch.device(cfg.device) if cfg.device else default_device())
    config = AutoConfig.from_pretrained(folder, trust_remote_code=False)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    info = describe(model, cfg.target, *resolve_spec(cfg.target))  # the identity a transformers capture records
    norm = final_norm(model)
    prefix = next(name for name, m in model.named_modules() if m is norm)
    state = read_tensors(folder, [f"{prefix}.{k}" for k in norm.state_dict()])
    norm.to_empty(device="cpu").load_state_dict({k.removeprefix(prefix + "."): v.to(dtype) for k, v in state.items()})
    arch = list(getattr(config, "architectures", None) or [type(model).__name__])  # for a config that names none
    return EngineTarget(
        info=info, folder=folder, architectures=arch, dtype=dtype, norm=norm.eval(), text_config=text_config(config)
    )


def worker_spec(
    cfg: ExtractConfig,
    engine: EngineTarget,
    ds: TokenizedDataset,
    rows: list[int],
    layer_ids: list[int],
    request_dir: Path,
) -> dict:
    """What `vllm_worker` runs: the model, the engine-convention layer ids, the rows."""
    on_cpu = (cfg.device or str(default_device())).startswith("cpu")
    # the cache one chunk of the longest samples needs, on CPU and GPU alike (not vLLM's share of the machine)
    chunk, width = min(cfg.engine_chunk, len(rows)), int(ds.lengths.max()) + 1
    memory: dict = {"kv_cache_memory_bytes": kv_cache_bytes(engine.text_config, engine.dtype.itemsize, chunk, width)}
    if not on_cpu:
        memory["gpu_memory_utilization"] = cfg.engine_memory  # vLLM's start-up check of what it may take
    in_process = on_cpu and cfg.tensor_parallel_size == 1  # no engine-core or worker processes to start: faster
    if in_process:
        memory["distributed_executor_backend"] = "uni"
    return {
        "in_process": in_process,
        "model": str(engine.folder),
        "dtype": VLLM_DTYPES[engine.dtype],
        "device": "cpu" if on_cpu else "cuda",
        "request_dir": str(request_dir),
        "max_model_len": int(ds.lengths.max()) + 1,
        "prefix_caching": cfg.prefix_caching,
        "tensor_parallel_size": cfg.tensor_parallel_size,
        "expert_parallel": cfg.expert_parallel,
        "layer_ids": layer_ids,
        "dataset": str(ds.path),
        "rows": rows,
        "chunk": cfg.engine_chunk,
        "engine_args": {**memory, "hf_overrides": {"architectures": engine.architectures}},
    }


def read_request(path: str, sample_id: int) -> dict[str, torch.Tensor]:
    """A request file of vLLM's connector, once its writer has released the `.lock` (it holds
    it while writing), then deleted with its lock."""
    lock = Path(path + ".lock")
    with open(lock) as f:
        fcntl.flock(f, fcntl.LOCK_SH)  # sleeps until the connector's writer lets go
        if not Path(path).exists():
            raise StageFailed(
                f"sample {sample_id}: vLLM's connector wrote no file {path} (its log above says why); "
                "the samples written are kept, rerun to resume"
            )
        data = load_file(path)
    Path(path).unlink(missing_ok=True)
    lock.unlink(missing_ok=True)
    return data


def check_request(data: dict[str, torch.Tensor], ids: np.ndarray, sample_id: int, n_slots: int, H: int) -> None:
    """The request file holds exactly the sample's tokens, one row each, every slot: else stop."""
    hs, got = data["hidden_states"], data["token_ids"].numpy()  # [T', n_slots, H], [T']
    T = len(ids)
    if hs.shape[0] != T or len(got) != T or not np.array_equal(got, ids):
        first = next((i for i in range(min(T, len(got))) if got[i] != ids[i]), min(T, len(got)))
        raise StageFailed(
            f"sample {sample_id}: vLLM returned {hs.shape[0]} rows for {len(got)} token ids, the dataset has {T} tokens "
            f"(first difference at token {first}); nothing of this sample was written. Rows must equal tokens: rerun "
            "without --prefix-caching, and check that vLLM got the dataset's token ids (max_model_len, truncation)"
        )
    if tuple(hs.shape[1:]) != (n_slots, H):
        raise StageFailed(
            f"sample {sample_id}: vLLM returned hidden states of shape {tuple(hs.shape)}, expected "
            f"[{T}, {n_slots}, {H}] ({n_slots} layer ids); is this vLLM's extract_hidden_states connector?"
        )


def start_worker(spec: dict, out: Path) -> subprocess.Popen:
    path = out / REQUESTS / "spec.json"
    path.write_text(json.dumps(spec))
    return subprocess.Popen(
        [sys.executable, "-m", "draftsmith.extract.vllm_worker", str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
    )


def stop_worker(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def reports(proc: subprocess.Popen, log: collections.deque) -> Iterator[dict]:
    """The worker's records, in order; its other lines (vLLM's log) go to stderr and `log`."""
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith(MARK):
            yield json.loads(line[len(MARK) :])
        else:
            log.append(line.rstrip())
            sys.stderr.write(line)


def capture_samples(
    cfg: ExtractConfig,
    engine: EngineTarget,
    ds: TokenizedDataset,
    todo: list[int],
    aux_layer_ids: list[int],
    out: Path,
    manifest: Path,
    progress: Progress,
) -> None:
    """Run vLLM over the `todo` rows and write each sample into the store. Raises StageFailed
    on a mismatch, a failed re-check, a spent error budget, a full disk or a dead worker."""
    if not todo:  # every sample is in the store already: no engine to start
        return
    info, H, n_aux = engine.info, engine.info.hidden_size, len(aux_layer_ids)
    layer_ids = engine_capture_ids(aux_layer_ids, info.num_layers, "vllm")  # vLLM's ids, ascending: its slot order
    aux_slots = [layer_ids.index(k) for k in to_engine(aux_layer_ids, "vllm")]
    final_slot = layer_ids.index(to_engine([info.num_layers], "vllm")[0])
    reference = load_target(cfg.target, cfg.device, cfg.dtype, shard=cfg.shard) if cfg.check_every else None
    tol = cfg.check_tol if cfg.check_tol is not None else (1e-3 if engine.dtype == torch.float32 else 5e-2)
    file_meta = {
        "format": "draftsmith-hidden-sample",
        "target": info.name,
        "fingerprint": info.fingerprint,
        "aux_layer_ids": ",".join(map(str, aux_layer_ids)),
        "dtype": str(engine.dtype).removeprefix("torch."),
    }
    buffers = HostBuffers(HOST_SLOTS, torch.device("cpu"))
    writer = StoreWriter(out, manifest, file_meta, n_aux, H, buffers, cfg.writers, cfg.staging_dir)
    requests = out / REQUESTS
    shutil.rmtree(requests, ignore_errors=True)  # a killed run's leftovers
    requests.mkdir()
    print(
        f"[extract] vLLM engine: {engine.folder}, layer ids {layer_ids} (vLLM's; the last is id L before the final "
        f"norm), tensor parallel {cfg.tensor_parallel_size}, expert parallel {cfg.expert_parallel}, prefix caching "
        f"{'on' if cfg.prefix_caching else 'off'}",
        flush=True,
    )
    proc = start_worker(worker_spec(cfg, engine, ds, todo, layer_ids, requests), out)
    log: collections.deque = collections.deque(maxlen=40)
    errors: list[str] = []
    since_check, done, cached, finished = cfg.check_every, 0, 0, False

    def collect(results) -> None:
        for r in results:
            errors.extend(r.errors)
            progress.advance(r.samples, tokens=r.tokens, bytes_written=r.bytes, errors=len(r.errors))

    try:
        for record in reports(proc, log):
            if record.get("done"):
                finished = True
                break
            if record.get("ready"):  # the engine's start (a minute on a GPU) is not the capture's rate
                progress.ready()
                continue
            r = int(record["row"])
            sample_id, a, b = int(ds.sample_ids[r]), int(ds.offsets[r]), int(ds.offsets[r + 1])
            ids = ds.ids[a:b]
            data = read_request(record["path"], sample_id)
            check_request(data, ids, sample_id, len(layer_ids), H)
            hs = data["hidden_states"].to(engine.dtype)  # [T, n_slots, H]
            aux = hs[:, aux_slots].reshape(len(ids), n_aux * H)  # [T, n_aux*H], in aux_layer_ids order
            with torch.no_grad():
                final = engine.norm(hs[:, final_slot])  # [T, H]: the target's own final norm on id L
            if reference is not None and since_check >= cfg.check_every:
                since_check = 0
                dev = reference.device
                reason = recheck(
                    reference.model,
                    torch.from_numpy(ids.astype(np.int64)).to(dev),
                    aux_layer_ids,
                    aux.to(dev),
                    final.to(dev),
                    tol,
                )
                if reason:
                    raise StageFailed(
                        f"sample {sample_id}: vLLM's capture {reason.removeprefix('re-check ')}: its layer "
                        "ids or norm differ from the target's; nothing of this sample was written"
                    )
            since_check += 1
            finite = torch.isfinite(aux).all(-1) & torch.isfinite(final).all(-1)  # [T]
            slot = buffers.acquire()
            host, event = buffers.to_host(slot, aux=aux, final=final, finite=finite)
            writer.submit([(sample_id, ids, ds.mask[a:b])], host, event, slot)
            collect(writer.poll())
            done += 1
            cached += int(record.get("cached", 0))
            if done % cfg.engine_chunk == 0 and proc.stdin is not None:
                with contextlib.suppress(BrokenPipeError):  # a dead worker: its end of stdout says so next
                    proc.stdin.write("\n")  # this chunk is in the store: the worker may start the next-but-one
                    proc.stdin.flush()
            if writer.stop_reason or len(errors) > cfg.max_errors:
                break
        collect(writer.drain())
    finally:
        stop_worker(proc)
        writer.close()
        shutil.rmtree(requests, ignore_errors=True)
        fsync_dir(out)
    if cfg.prefix_caching:
        print(
            f"[extract] vLLM's prefix cache served {cached} prompt tokens of {done} samples; every sample got all "
            "its rows",
            flush=True,
        )
    if writer.stop_reason:
        raise StageFailed(f"{writer.stop_reason} ({progress.done} samples written in this run were kept)")
    if len(errors) > cfg.max_errors:
        raise StageFailed(
            f"{len(errors)} validation failures exceed --max-errors {cfg.max_errors}; stopped, valid samples "
            "kept. First failures:\n  " + "\n  ".join(errors[:5])
        )
    if not finished and done < len(todo):
        tail = "\n  ".join(log)
        raise StageFailed(
            f"the vLLM worker stopped after {done} of {len(todo)} samples ({exit_reason(proc.returncode)}); "
            f"the samples written are kept, rerun to resume. Its last lines:\n  {tail}"
        )
    if errors:
        print(
            f"[extract] {len(errors)} samples failed validation and were not written; rerun to retry them:\n  "
            + "\n  ".join(errors[:5]),
            flush=True,
        )
