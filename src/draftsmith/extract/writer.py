"""The asynchronous store writer: host buffers, per-sample validation, atomic files, manifest.

The extraction loop hands over one forward batch at a time, gathered to the valid rows (`[N, ...]`,
N = the batch's real tokens) and copied to host memory with non-blocking transfers. A thread
pool writes its samples in parallel, one safetensors file each. A small pool of reusable (pinned,
on GPU) host buffers is the bounded queue: when every buffer is still being written, the loop
waits for the disk, never the other way round. The safetensors header is built here and the
tensor bytes written straight from the host buffer, so the threads spend their time in
`write`/`fsync`/CRC, which release the GIL.

Each sample is validated (rows == tokens, no NaN/Inf), written to a temporary name, fsynced and
renamed into place; then the batch's manifest lines are appended with one `write()` + fsync. A
failed write (a full disk, the file-size limit) stops the writer cleanly; samples already listed
stay valid.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import struct
import threading
import zlib
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from draftsmith.data.store import check_sample, sample_relpath
from draftsmith.errors import from_os_error
from draftsmith.fsutil import append_line, fsync_dir

ST_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16", torch.int32: "I32", torch.uint8: "U8"}
NP_DTYPES = {np.dtype(np.int32): "I32", np.dtype(np.uint8): "U8"}


@dataclass
class BatchResult:
    """What one written batch did; the loop folds these into progress and the error budget."""

    samples: int = 0
    tokens: int = 0
    bytes: int = 0
    errors: list[str] = field(default_factory=list)


def _raw(x: np.ndarray | torch.Tensor) -> tuple[str, list[int], memoryview]:
    """(safetensors dtype, shape, bytes view) of a contiguous array or tensor, without a copy."""
    if isinstance(x, np.ndarray):
        x = np.ascontiguousarray(x)
        return NP_DTYPES[x.dtype], list(x.shape), memoryview(x).cast("B")
    x = x.contiguous()
    return ST_DTYPES[x.dtype], list(x.shape), memoryview(x.reshape(-1).view(torch.uint8).numpy())


def encode_sample(
    input_ids: np.ndarray, loss_mask: np.ndarray, aux: torch.Tensor, final: torch.Tensor, file_meta: dict[str, str]
) -> list[memoryview | bytes]:
    """One sample in the safetensors format, as buffers to write in order (no tensor copies):
    8-byte header length, JSON header (space-padded to 8 bytes), then the raw tensors
    input_ids [T] int32, loss_mask [T] uint8, aux_hidden_states [T, n_aux*H], final_hidden_states [T, H]."""
    tensors = {
        "input_ids": np.asarray(input_ids, dtype=np.int32),
        "loss_mask": np.asarray(loss_mask, dtype=np.uint8),
        "aux_hidden_states": aux,
        "final_hidden_states": final,
    }
    header: dict[str, Any] = {"__metadata__": file_meta}
    parts: list[memoryview | bytes] = []
    offset = 0
    for name, t in tensors.items():
        dtype, shape, view = _raw(t)
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + view.nbytes]}
        parts.append(view)
        offset += view.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return [struct.pack("<Q", len(raw)) + raw, *parts]


def place_file(dest: Path, parts: list[memoryview | bytes], staging_dir: Path | None) -> None:
    """Atomically publish the concatenated `parts` at `dest`: temporary name, fsync, rename.
    With a staging folder the file is written there first and then copied in."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}-{threading.get_ident()}.tmp")
    staged = staging_dir / tmp.name if staging_dir is not None else None
    try:
        with open(staged or tmp, "wb", buffering=0) as f:
            for part in parts:
                view = memoryview(part)
                while view.nbytes:
                    view = view[f.write(view) :]
            if staged is None:
                os.fsync(f.fileno())
        if staged is not None:
            shutil.copyfile(staged, tmp)
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
        if staged is not None:
            staged.unlink(missing_ok=True)


def crc32_parts(parts: list[memoryview | bytes]) -> str:
    crc = 0
    for part in parts:
        crc = zlib.crc32(part, crc)
    return f"{crc & 0xFFFFFFFF:08x}"


class HostBuffers:
    """A bounded pool of reusable host buffers for device -> host copies. `acquire` blocks while
    all `n` are in flight. On CUDA the buffers are pinned (allocated up front for `rows` rows of
    each width, grown if a batch needs more) and the copies non-blocking; on CPU the captured
    tensors are used as they are."""

    def __init__(
        self, n: int, device: torch.device, rows: int = 0, widths: dict[str, tuple[int, torch.dtype]] | None = None
    ) -> None:
        self.device = device
        self._free: queue.Queue[dict[str, torch.Tensor]] = queue.Queue()
        for _ in range(n):
            slot = {}
            if device.type == "cuda" and widths:
                slot = {k: torch.empty(rows * w, dtype=dt, pin_memory=True) for k, (w, dt) in widths.items()}
            self._free.put(slot)

    def acquire(self) -> dict[str, torch.Tensor]:
        return self._free.get()

    def release(self, slot: dict[str, torch.Tensor]) -> None:
        self._free.put(slot)

    def to_host(self, slot: dict[str, torch.Tensor], **tensors: torch.Tensor) -> tuple[dict[str, torch.Tensor], Any]:
        """Copy each device tensor into the slot. Returns the host views and a CUDA event that
        completes when the copies have landed (None on CPU)."""
        if self.device.type != "cuda":
            return tensors, None
        out = {}
        for name, t in tensors.items():
            buf = slot.get(name)
            if buf is None or buf.dtype != t.dtype or buf.numel() < t.numel():
                buf = slot[name] = torch.empty(t.numel(), dtype=t.dtype, pin_memory=True)
            view = buf[: t.numel()].view(t.shape)
            view.copy_(t, non_blocking=True)
            out[name] = view
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(self.device))
        return out, event


@dataclass
class _Batch:
    """A batch in flight: its host slot, its manifest lines so far, and a countdown."""

    slot: dict
    event: Any
    remaining: int
    result: BatchResult = field(default_factory=BatchResult)
    lines: list[str] = field(default_factory=list)
    folders: set[Path] = field(default_factory=set)
    future: Future = field(default_factory=Future)
    lock: threading.Lock = field(default_factory=threading.Lock)


class StoreWriter:
    """Writes batches of samples into a store folder from a thread pool.

    `submit` takes host tensors for one batch: aux [N, n_aux*H], final [N, H], finite [N] bool
    (per-row NaN/Inf check done on the device), and per-sample (sample_id, input_ids, loss_mask)
    whose lengths sum to N. Finished batches are collected with `poll()` / `drain()`.
    """

    def __init__(
        self,
        out: Path,
        manifest: Path,
        file_meta: dict[str, str],
        n_aux: int,
        hidden_size: int,
        buffers: HostBuffers,
        threads: int = 4,
        staging_dir: Path | None = None,
    ) -> None:
        self.out, self.manifest, self.file_meta = Path(out), Path(manifest), file_meta
        self.n_aux, self.hidden_size, self.buffers, self.staging_dir = n_aux, hidden_size, buffers, staging_dir
        self.pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="store-writer")
        self.pending: list[Future[BatchResult]] = []
        self.stop_reason: str | None = None  # set when the disk is full or a write fails
        self._manifest_lock = threading.Lock()

    def submit(
        self, samples: list[tuple[int, np.ndarray, np.ndarray]], host: dict[str, torch.Tensor], event: Any, slot: dict
    ) -> None:
        total = sum(len(ids) for _, ids, _ in samples)
        assert total == host["aux"].shape[0] == host["final"].shape[0], (
            f"batch rows {host['aux'].shape[0]} != tokens {total}"
        )
        batch = _Batch(slot=slot, event=event, remaining=len(samples))
        self.pending.append(batch.future)
        offset = 0
        for sample_id, ids, mask in samples:
            rows = slice(offset, offset + len(ids))
            offset += len(ids)
            self.pool.submit(
                self._write_sample,
                batch,
                sample_id,
                ids,
                mask,
                host["aux"][rows],
                host["final"][rows],
                host["finite"][rows],
            )

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

    def _write_sample(self, batch: _Batch, sample_id: int, ids, mask, aux, final, finite) -> None:
        try:
            if batch.event is not None:
                batch.event.synchronize()
            if self.stop_reason is None:
                self._write_one(batch, sample_id, ids, mask, aux, final, finite)
        except BaseException as e:  # an unexpected bug: surface it through the batch's future
            if not batch.future.done():
                batch.future.set_exception(e)
        finally:
            with batch.lock:
                batch.remaining -= 1
                last = batch.remaining == 0
            if last:
                self._finish(batch)

    def _write_one(self, batch: _Batch, sample_id: int, ids, mask, aux, final, finite) -> None:
        T = len(ids)
        if aux.shape[0] != T or final.shape[0] != T or len(mask) != T:  # rows == tokens, always
            with batch.lock:
                batch.result.errors.append(f"sample {sample_id}: {aux.shape[0]} captured rows for {T} tokens")
            return
        if not bool(finite.all()):
            bad = int((~finite).nonzero()[0, 0])
            with batch.lock:
                batch.result.errors.append(f"sample {sample_id}: NaN or Inf in the hidden states at token {bad}")
            return
        check_sample(
            {"input_ids": ids, "loss_mask": mask, "aux_hidden_states": aux, "final_hidden_states": final},
            self.n_aux,
            self.hidden_size,
            f"sample {sample_id}",
        )
        parts = encode_sample(ids, mask, aux, final, {**self.file_meta, "sample_id": str(sample_id)})
        rel = sample_relpath(sample_id)
        try:
            place_file(self.out / rel, parts, self.staging_dir)
        except OSError as e:
            self._stop(e, f"sample {sample_id} to {self.out / rel}")
            return
        nbytes = sum(memoryview(p).nbytes for p in parts)
        entry = {"sample_id": sample_id, "path": rel, "tokens": T, "bytes": nbytes, "crc32": crc32_parts(parts)}
        with batch.lock:
            batch.lines.append(json.dumps(entry, separators=(",", ":")))
            batch.folders.add((self.out / rel).parent)
            batch.result.samples += 1
            batch.result.tokens += T
            batch.result.bytes += nbytes

    def _finish(self, batch: _Batch) -> None:
        """All of a batch's files are in place: make the renames durable, list them, free the slot."""
        try:
            if batch.lines:
                for folder in batch.folders:
                    fsync_dir(folder)
                with self._manifest_lock:
                    append_line(self.manifest, "\n".join(batch.lines))
        except OSError as e:
            self._stop(e, f"the manifest {self.manifest}")
            batch.result = BatchResult(errors=batch.result.errors)  # not listed: rewritten on resume
        finally:
            self.buffers.release(batch.slot)
            if not batch.future.done():
                batch.future.set_result(batch.result)

    def _stop(self, e: OSError, what: str) -> None:
        """Stop at a failed write: a full disk or file-size limit says what to free and that a rerun resumes."""
        self.stop_reason = f"writing {what}: {from_os_error(e)}"


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
