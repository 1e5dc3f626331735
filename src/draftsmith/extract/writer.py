"""The asynchronous store writer: host buffers, per-sample validation, atomic files, manifest.

The extraction loop hands over one forward batch at a time, already gathered to the valid rows
(`[N, ...]`, N = the batch's real tokens) and copied to host memory with non-blocking
transfers. A thread pool turns each batch into per-sample safetensors files; a bounded pool of
reusable (pinned, on GPU) host buffers is the bounded queue: when every buffer is in flight,
the loop waits for the disk, never the other way round.

Each sample is validated before it is written (rows == tokens, no NaN/Inf), written to a
temporary name, fsynced and renamed into place, and only then appended to the manifest with one
`write()`. A full disk (ENOSPC) stops the writer cleanly; already listed samples stay valid.
"""

from __future__ import annotations

import errno
import json
import os
import queue
import shutil
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import save

from draftsmith.extract.store import check_sample, crc32, sample_relpath
from draftsmith.fsutil import append_line, atomic_write_bytes, fsync_dir


@dataclass
class BatchResult:
    """What one written batch did; the loop folds these into progress and the error budget."""

    samples: int = 0
    tokens: int = 0
    bytes: int = 0
    errors: list[str] = field(default_factory=list)


def encode_sample(
    input_ids: np.ndarray, loss_mask: np.ndarray, aux: torch.Tensor, final: torch.Tensor, file_meta: dict[str, str]
) -> bytes:
    """One sample as safetensors bytes: input_ids [T] int32, loss_mask [T] uint8,
    aux_hidden_states [T, n_aux*H], final_hidden_states [T, H]."""
    tensors = {
        "input_ids": torch.from_numpy(np.array(input_ids, dtype=np.int32)),
        "loss_mask": torch.from_numpy(np.array(loss_mask, dtype=np.uint8)),
        "aux_hidden_states": aux.contiguous(),
        "final_hidden_states": final.contiguous(),
    }
    return save(tensors, metadata=file_meta)


def place_file(dest: Path, data: bytes, staging_dir: Path | None) -> None:
    """Atomically publish `data` at `dest` (tmp name, fsync, rename). With a staging folder the
    bytes land there first and are then copied in, so slow storage never holds host memory."""
    if staging_dir is None:
        atomic_write_bytes(dest, data)
        return
    staged = staging_dir / f"{os.getpid()}-{threading.get_ident()}-{dest.name}"
    staged.write_bytes(data)
    tmp = dest.with_name(f".{dest.name}.staged.tmp")
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(staged, tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, dest)
    finally:
        staged.unlink(missing_ok=True)
        tmp.unlink(missing_ok=True)


class HostBuffers:
    """A bounded pool of reusable host buffers for device -> host copies. `acquire` blocks while
    all `n` are in flight. On CUDA the buffers are pinned and the copies non-blocking; on CPU the
    captured tensors are used as they are."""

    def __init__(self, n: int, device: torch.device) -> None:
        self.device = device
        self._free: queue.Queue[dict[str, torch.Tensor]] = queue.Queue()
        for _ in range(n):
            self._free.put({})

    def acquire(self) -> dict[str, torch.Tensor]:
        return self._free.get()

    def release(self, slot: dict[str, torch.Tensor]) -> None:
        self._free.put(slot)

    def to_host(self, slot: dict[str, torch.Tensor], **tensors: torch.Tensor) -> tuple[dict[str, torch.Tensor], Any]:
        """Copy each device tensor into the slot (growing its buffers when needed). Returns the
        host views and a CUDA event that completes when the copies have landed (None on CPU)."""
        if self.device.type != "cuda":
            return tensors, None
        out = {}
        for name, t in tensors.items():
            buf = slot.get(name)
            if buf is None or buf.dtype != t.dtype or buf.numel() < t.numel():
                buf = torch.empty(int(t.numel() * 1.25) + 1, dtype=t.dtype, pin_memory=True)
                slot[name] = buf
            view = buf[: t.numel()].view(t.shape)
            view.copy_(t, non_blocking=True)
            out[name] = view
        event = torch.cuda.Event()
        event.record()
        return out, event


class StoreWriter:
    """Writes batches of samples into a store folder from a thread pool.

    `submit` takes host tensors for one batch: aux [N, n_aux*H], final [N, H], finite [N] bool
    (per-row NaN/Inf check done on the device), and per-sample (sample_id, input_ids, loss_mask)
    whose lengths sum to N. Finished batches are collected with `poll()` / `drain()`.
    """

    def __init__(
        self, out: Path, manifest: Path, file_meta: dict[str, str], n_aux: int, hidden_size: int,
        buffers: HostBuffers, threads: int = 4, staging_dir: Path | None = None,
    ) -> None:
        self.out, self.manifest, self.file_meta = Path(out), Path(manifest), file_meta
        self.n_aux, self.hidden_size, self.buffers, self.staging_dir = n_aux, hidden_size, buffers, staging_dir
        self.pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="store-writer")
        self.pending: list[Future[BatchResult]] = []
        self.stop_reason: str | None = None  # set when the disk is full or a write fails
        self._lock = threading.Lock()

    def submit(self, samples: list[tuple[int, np.ndarray, np.ndarray]], host: dict[str, torch.Tensor], event: Any, slot: dict) -> None:
        self.pending.append(self.pool.submit(self._write_batch, samples, host, event, slot))

    def poll(self) -> list[BatchResult]:
        """Results of the batches finished so far (without waiting)."""
        done = [f for f in self.pending if f.done()]
        self.pending = [f for f in self.pending if not f.done()]
        return [f.result() for f in done]

    def drain(self) -> list[BatchResult]:
        results = [f.result() for f in self.pending]
        self.pending = []
        return results

    def close(self) -> None:
        self.pool.shutdown(wait=True)

    def _write_batch(self, samples, host, event, slot) -> BatchResult:  # noqa: ANN001
        result = BatchResult()
        try:
            if event is not None:
                event.synchronize()
            offset = 0
            for sample_id, ids, mask in samples:
                T = len(ids)
                rows = slice(offset, offset + T)
                offset += T
                if self.stop_reason is not None:
                    continue
                self._write_one(result, sample_id, ids, mask, host["aux"][rows], host["final"][rows], host["finite"][rows])
            assert offset == host["aux"].shape[0], f"batch rows {host['aux'].shape[0]} != tokens {offset}"
        finally:
            self.buffers.release(slot)
        return result

    def _write_one(self, result: BatchResult, sample_id: int, ids, mask, aux, final, finite) -> None:  # noqa: ANN001
        T = len(ids)
        if aux.shape[0] != T or final.shape[0] != T or len(mask) != T:  # rows == tokens, always
            result.errors.append(f"sample {sample_id}: {aux.shape[0]} captured rows for {T} tokens")
            return
        if not bool(finite.all()):
            bad = int((~finite).nonzero()[0, 0])
            result.errors.append(f"sample {sample_id}: NaN or Inf in the hidden states at token {bad}")
            return
        data = encode_sample(ids, mask, aux, final, {**self.file_meta, "sample_id": str(sample_id)})
        check_sample({"input_ids": ids, "loss_mask": mask, "aux_hidden_states": aux, "final_hidden_states": final},
                     self.n_aux, self.hidden_size, f"sample {sample_id}")
        rel = sample_relpath(sample_id)
        try:
            place_file(self.out / rel, data, self.staging_dir)
            entry = {"sample_id": sample_id, "path": rel, "tokens": T, "bytes": len(data), "crc32": crc32(data)}
            with self._lock:
                append_line(self.manifest, json.dumps(entry, separators=(",", ":")))
        except OSError as e:
            if e.errno == errno.ENOSPC:
                self.stop_reason = f"disk full while writing sample {sample_id} to {self.out}: free space and rerun the same command to resume"
            else:
                self.stop_reason = f"cannot write sample {sample_id} to {self.out / rel}: {e}"
            return
        result.samples += 1
        result.tokens += T
        result.bytes += len(data)


def clean_orphans(out: Path, listed: set[str]) -> int:
    """Remove temporary files and sample files that no manifest lists (a kill between rename and
    manifest append): they are rewritten by this run. Only directory listings, no file reads."""
    removed = 0
    for folder in out.glob("rows_*"):
        if not folder.is_dir():
            continue
        with os.scandir(folder) as it:
            for e in it:
                rel = f"{folder.name}/{e.name}"
                if e.name.endswith(".tmp") or (e.name.endswith(".safetensors") and rel not in listed):
                    os.unlink(e.path)
                    removed += 1
        fsync_dir(folder)
    return removed

