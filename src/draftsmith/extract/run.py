"""`draftsmith extract`: capture the target's hidden states for a tokenized dataset into a store.

Reads top to bottom: load the dataset and target, open (or resume) the store, preflight the
disk, then loop over length-bucketed batches: forward with hook capture (no KV cache), gather
the real rows, copy to host without blocking, and hand the batch to the async writer. Every
`--check-every` samples one sample is re-run alone, unpadded, and compared. Validation failures
count against `--max-errors`; a full disk or a spent error budget stops the run with everything
valid kept, and a rerun of the same command resumes. `--out` is locked for the run: a second
extraction into it is refused. `--plan` prints the disk projection and preflight from the
target's config alone, and stops.

Under `torchrun --nproc-per-node N`, rank r takes the samples with `sample_id % N == r`, lists
them in `manifest.rank{r}.jsonl`, and rank 0 merges the manifests into one store at the end.
torch.distributed is used for barriers only. A target larger than one GPU runs in one process
with `--shard auto`: its layers split over the visible GPUs, the hooks' captures gathered on the
input embedding's GPU (docs/large-targets.md).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import numpy as np
import torch

from draftsmith.config import write_run_record
from draftsmith.data.dataset import TokenizedDataset, check_tokenizer, load_dataset, pad_batch
from draftsmith.data.store import (
    HOST_SLOTS,
    MANIFEST,
    STORE_FILE,
    dataset_identity,
    files_on_disk,
    length_batches,
    manifest_files,
    new_store_meta,
    projected_bytes,
    rank_manifest_name,
    read_manifest,
    read_store_meta,
    repair_manifest,
    sample_relpath,
    source_mismatches,
    store_fit,
    write_manifest,
)
from draftsmith.errors import StageFailed, UserError
from draftsmith.extract.config import ExtractConfig
from draftsmith.extract.recheck import recheck
from draftsmith.extract.vllm_capture import capture_samples, open_engine
from draftsmith.extract.writer import HostBuffers, StoreWriter, clean_orphans
from draftsmith.fsutil import atomic_write_json, check_output, human_bytes, made_by, mark_output, output_lock
from draftsmith.layers import resolve_aux_layers
from draftsmith.progress import Progress
from draftsmith.runtime.capture import capture, pads_sequences
from draftsmith.target import Target, default_device, load_target, load_text_config, load_tokenizer, parse_dtype
from draftsmith.torchrun import dist_env


def barrier(world: int) -> None:
    if world > 1:
        torch.distributed.barrier()


def check_token_ids(ds: TokenizedDataset, vocab_size: int) -> None:
    if len(ds) and int(ds.ids.max()) >= vocab_size:
        row = int(np.searchsorted(ds.offsets, int(np.argmax(ds.ids >= vocab_size)), side="right") - 1)
        raise UserError(
            f"{ds.path}: sample {int(ds.sample_ids[row])} holds token ids >= the target's vocab size {vocab_size}; "
            f"was the dataset prepared with another tokenizer? Re-run `draftsmith prepare` with this --target"
        )


def open_store(out: Path, meta: dict, create: bool) -> None:
    """Write store.json for a new store, or refuse to mix with a store of another target, layer
    set, dtype or dataset."""
    if (out / STORE_FILE).exists():
        old = read_store_meta(out)
        mismatches = source_mismatches(old, meta["target"], meta["dataset"]) + [
            f"{what}: store has {old[what]!r}, this run {meta[what]!r}"
            for what in ("aux_layer_ids", "dtype")
            if old[what] != meta[what]
        ]
        if mismatches:
            raise UserError(
                f"{out} holds a store made by another run ({'; '.join(mismatches)}); refusing to mix. "
                f"Use a new --out, or the original dataset/--target/--aux-layer-ids/--dtype"
            )
        if create and made_by(out) is None:
            mark_output(out, "extract")  # a store made before outputs were marked
    elif create:
        mark_output(out, "extract")
        atomic_write_json(out / STORE_FILE, meta)


def projection(ds: TokenizedDataset, done: dict[int, dict], n_aux: int, H: int, dsize: int) -> tuple[int, int, int]:
    """The store's projected bytes in all, the bytes still to write, and for how many samples:
    those not in `done` (the manifest's entries)."""
    whole = projected_bytes(int(ds.lengths.sum()), len(ds), n_aux, H, dsize)
    todo = [i for i in range(len(ds)) if int(ds.sample_ids[i]) not in done]
    return whole, projected_bytes(int(ds.lengths[todo].sum()), len(todo), n_aux, H, dsize), len(todo)


def preflight(out: Path, need: int, todo: int, saved: int, force: bool, world: int) -> bool:
    """Refuse to start when the disk cannot hold what is still to write: the `todo` samples not
    yet in the store (a resume needs only those; the `saved` ones stay) plus `store_fit`'s margin
    for the projection's error. Returns whether it fits (with `force`, not a refusal)."""
    fit = store_fit(need, out)
    free, margin = fit.free, fit.margin
    kept = f"; the {saved} samples already in the store are kept" if saved else ""
    print(
        f"[extract] preflight: ~{human_bytes(need)} still to write for {todo} samples (+{human_bytes(margin)} margin), "
        f"{human_bytes(free)} free on {out}" + (f" (all {world} ranks)" if world > 1 else "") + kept,
        flush=True,
    )
    if not fit.fits and not force:
        raise UserError(
            f"not enough disk for the store: the {todo} samples still to extract need ~{human_bytes(need + margin)} "
            f"(~{human_bytes(need)} + {human_bytes(margin)} margin) and {out} has {human_bytes(free)} free{kept}. "
            f"Free at least {human_bytes(need + margin - free)}, choose another --out, or pass "
            f"--force to start anyway (the run stops cleanly when the disk fills and resumes after space is freed)"
        )
    return fit.fits


def gather_rows(x: torch.Tensor, lengths: list[int]) -> torch.Tensor:
    """x [B, T_max, D] right-padded -> [sum(lengths), D], the real rows in sample order."""
    B, T, D = x.shape
    idx = torch.cat([torch.arange(n) + j * T for j, n in enumerate(lengths)])  # [N]
    if x.device.type == "cuda":
        idx = idx.pin_memory()  # a non-blocking copy: the host never waits for the GPU here
    return x.reshape(B * T, D).index_select(0, idx.to(x.device, non_blocking=True))


def listed_samples(out: Path) -> tuple[dict[int, dict], list[int]]:
    """The manifest's entries whose file is in place, and the ids of those whose file is gone
    (deleted after a failed checksum, say): those are extracted again."""
    entries, present = read_manifest(out), files_on_disk(out)
    lost = sorted(s for s, e in entries.items() if e["path"] not in present)
    return {s: e for s, e in entries.items() if e["path"] in present}, lost


def merge_manifests(out: Path) -> dict[int, dict]:
    """Fold per-rank manifests into manifest.jsonl (atomic rewrite), then drop them."""
    entries = read_manifest(out)
    if any(f.name != MANIFEST for f in manifest_files(out)):
        write_manifest(out, entries)
    return entries


def resolve_device(cfg: ExtractConfig, world: int, local_rank: int) -> torch.device:
    if world > 1 and torch.cuda.is_available():
        return torch.device("cuda", local_rank)
    return torch.device(cfg.device) if cfg.device else default_device()


def plan_store(cfg: ExtractConfig) -> Path:
    """`extract --plan`: the store's projected size against the free space at --out, from the
    dataset and the target's config alone: no weights are loaded, nothing is written."""
    ds, out = load_dataset(cfg.dataset_dir), Path(cfg.out)
    tc = load_text_config(cfg.target)
    num_layers, H = int(tc.num_hidden_layers), int(tc.hidden_size)
    aux_layer_ids = resolve_aux_layers(cfg.aux_layer_ids, num_layers, count=None)  # a store for any drafter
    dtype = parse_dtype(cfg.dtype, torch.device(cfg.device) if cfg.device else default_device())
    whole, need, todo = projection(ds, listed_samples(out)[0], len(aux_layer_ids), H, dtype.itemsize)
    tokens = int(ds.lengths.sum())
    print(
        f"[extract] plan: {len(ds)} samples, {tokens} tokens; layers {aux_layer_ids} of {num_layers}, hidden size {H}, "
        f"{str(dtype).removeprefix('torch.')}: the store takes ~{human_bytes(whole)} "
        f"({human_bytes(whole / max(tokens, 1))} per token)",
        flush=True,
    )
    fits = preflight(out, need, todo, len(ds) - todo, force=True, world=1)
    print(f"[extract] plan: {'it fits' if fits else 'it DOES NOT FIT'}; nothing was loaded or written", flush=True)
    return out


def run(cfg: ExtractConfig) -> Path:
    """Extract with --out locked for the whole run (rank 0 holds the lock for all ranks): a
    second extraction into the same folder is refused, before any model is loaded. With
    --plan, only print the store's projection (`plan_store`)."""
    if cfg.plan:
        return plan_store(cfg)
    check_output(cfg.out, "extract", [cfg.dataset_dir, cfg.target])  # an existing --out must be a store
    rank, _, _ = dist_env()
    with output_lock(Path(cfg.out)) if rank == 0 else contextlib.nullcontext():
        return extract(cfg)  # out of memory: the CLI's error (the samples written are kept)


def extract(cfg: ExtractConfig) -> Path:
    rank, world, local_rank = dist_env()
    ds = load_dataset(cfg.dataset_dir)
    out = Path(cfg.out)
    if cfg.engine == "vllm":  # vLLM runs the target in its own process; here only its identity and final norm
        engine, target = open_engine(cfg), None
        info, dtype = engine.info, engine.dtype
    else:
        device = resolve_device(cfg, world, local_rank)
        if device.type == "cuda" and device.index is not None:
            torch.cuda.set_device(device)  # streams, events and NCCL barriers on this rank's GPU
        if world > 1 and not torch.distributed.is_initialized():
            torch.distributed.init_process_group("nccl" if device.type == "cuda" else "gloo")
        engine, target = None, load_target(cfg.target, device, cfg.dtype, shard=cfg.shard)
        info, dtype = target.info, target.dtype
    aux_layer_ids = resolve_aux_layers(cfg.aux_layer_ids, info.num_layers, count=None)  # a store for any drafter
    check_token_ids(ds, info.vocab_size)
    check_tokenizer(ds, target.tokenizer if target is not None else load_tokenizer(cfg.target), cfg.target)
    meta = new_store_meta(info.to_dict(), aux_layer_ids, str(dtype).removeprefix("torch."), dataset_identity(ds))

    if rank == 0:
        open_store(out, meta, create=False)  # refuse to mix with another run's store, before anything is written
    done, lost = listed_samples(out)  # no sample file is opened
    mine = [i for i in range(len(ds)) if int(ds.sample_ids[i]) % world == rank]
    todo = [i for i in mine if int(ds.sample_ids[i]) not in done]
    whole, need, n_todo = projection(ds, done, len(aux_layer_ids), info.hidden_size, dtype.itemsize)
    preflight(out, need, n_todo, len(ds) - n_todo, cfg.force, world)
    if rank == 0:  # rank 0 creates the store and clears leftovers of a killed run before anyone writes
        out.mkdir(parents=True, exist_ok=True)
        open_store(out, meta, create=True)
        for f in manifest_files(out):
            repair_manifest(f)
        if lost:
            print(
                f"[extract] {len(lost)} listed samples have no file (e.g. {lost[:5]}); extracting them again",
                flush=True,
            )
            write_manifest(out, done)
        if made_by(out) == "extract":  # only in a folder marked as a store
            clean_orphans(out, {e["path"] for e in done.values()})
        write_run_record(out, cfg)
    barrier(world)

    manifest = out / (MANIFEST if world == 1 else rank_manifest_name(rank))
    stage = "extract" if world == 1 else f"extract rank {rank}"
    with Progress(stage, out if rank == 0 else None, total=len(mine), bytes_projected=whole) as progress:
        progress.skip(len(mine) - len(todo))
        if engine is not None:
            capture_samples(cfg, engine, ds, todo, aux_layer_ids, out, manifest, progress)
        else:
            extract_samples(cfg, target, ds, todo, aux_layer_ids, out, manifest, progress)
    barrier(world)
    if rank == 0:
        finish_store(out, meta, len(ds))
    if world > 1:
        torch.distributed.destroy_process_group()
    return out


def extract_samples(
    cfg: ExtractConfig,
    target: Target,
    ds: TokenizedDataset,
    todo: list[int],
    aux_layer_ids: list[int],
    out: Path,
    manifest: Path,
    progress: Progress,
) -> None:
    """The loop: batches -> capture -> validation -> async writer. Raises StageFailed when the
    error budget is spent or the disk is full, after every queued valid sample is written."""
    model, device = target.model, target.device
    tol = cfg.check_tol if cfg.check_tol is not None else (1e-3 if target.dtype == torch.float32 else 5e-2)
    n_aux, H = len(aux_layer_ids), target.info.hidden_size
    widths = {"aux": (n_aux * H, target.dtype), "final": (H, target.dtype), "finite": (1, torch.bool)}
    buffers = HostBuffers(HOST_SLOTS, device, rows=cfg.token_budget, widths=widths)
    file_meta = {
        "format": "draftsmith-hidden-sample",
        "target": target.info.name,
        "fingerprint": target.info.fingerprint,
        "aux_layer_ids": ",".join(map(str, aux_layer_ids)),
        "dtype": str(target.dtype).removeprefix("torch."),
    }
    writer = StoreWriter(out, manifest, file_meta, n_aux, H, buffers, cfg.writers, cfg.staging_dir)
    if cfg.staging_dir is not None:
        Path(cfg.staging_dir).mkdir(parents=True, exist_ok=True)
    errors: list[str] = []
    since_check = cfg.check_every  # the first batch is re-checked

    def collect(results) -> None:
        for r in results:
            errors.extend(r.errors)
            progress.advance(r.samples, tokens=r.tokens, bytes_written=r.bytes, errors=len(r.errors))

    padded = pads_sequences(model, aux_layer_ids)
    if not padded:
        print(
            f"[extract] {type(model).__name__} fails on a padded batch under an attention mask: "
            "one sample per forward instead (slower, same values)",
            flush=True,
        )
    try:
        batches = length_batches(
            ds.lengths[todo], cfg.token_budget, shuffle=True, seed=0, max_batch=None if padded else 1
        )
        for batch in batches:
            rows = [todo[j] for j in batch]
            ids, mask, lengths = pad_batch(ds, rows, device)  # [B, T_max] each
            aux, final = capture(model, ids, mask, aux_layer_ids)  # [B, T_max, n_aux*H], [B, T_max, H]
            keep = list(range(len(rows)))
            if cfg.check_every and since_check >= cfg.check_every:
                since_check = 0
                j = len(rows) // 2
                reason = recheck(
                    model, ids[j, : lengths[j]], aux_layer_ids, aux[j, : lengths[j]], final[j, : lengths[j]], tol
                )
                if reason:
                    errors.append(f"sample {int(ds.sample_ids[rows[j]])}: {reason}")
                    progress.advance(0, errors=1)
                    keep.remove(j)
            since_check += len(rows)
            kept_lengths = [lengths[j] for j in keep]
            if len(keep) < len(rows):  # rare: a sample failed its re-check
                sel = torch.tensor(keep, device=device)
                aux, final = aux.index_select(0, sel), final.index_select(0, sel)
            if keep:
                aux_rows = gather_rows(aux, kept_lengths)  # [N, n_aux*H]
                final_rows = gather_rows(final, kept_lengths)  # [N, H]
                finite = torch.isfinite(aux_rows).all(-1) & torch.isfinite(final_rows).all(-1)  # [N]
                slot = buffers.acquire()  # blocks only when every host buffer is still being written
                host, event = buffers.to_host(slot, aux=aux_rows, final=final_rows, finite=finite)
                samples = []
                for j in keep:
                    r = rows[j]
                    a, b = ds.offsets[r], ds.offsets[r + 1]
                    samples.append((int(ds.sample_ids[r]), ds.ids[a:b], ds.mask[a:b]))
                writer.submit(samples, host, event, slot)
            collect(writer.poll())
            if writer.stop_reason or len(errors) > cfg.max_errors:
                break
        collect(writer.drain())
    finally:
        writer.close()
    if writer.stop_reason:
        raise StageFailed(f"{writer.stop_reason} ({progress.done} samples written in this run were kept)")
    if len(errors) > cfg.max_errors:
        shown = "\n  ".join(errors[:5])
        raise StageFailed(
            f"{len(errors)} validation failures exceed --max-errors {cfg.max_errors}; stopped, valid samples kept. "
            f"First failures:\n  {shown}"
        )
    if errors:
        print(
            f"[extract] {len(errors)} samples failed validation and were not written; rerun to retry them:\n  "
            + "\n  ".join(errors[:5]),
            flush=True,
        )


def finish_store(out: Path, meta: dict, n_samples: int) -> None:
    """Merge manifests and record totals in store.json."""
    entries = merge_manifests(out)
    assert all(e["path"] == sample_relpath(s) for s, e in entries.items())
    meta = {
        **meta,
        "totals": {
            "samples": len(entries),
            "tokens": sum(e["tokens"] for e in entries.values()),
            "bytes": sum(e["bytes"] for e in entries.values()),
        },
        "complete": len(entries) == n_samples,
    }
    atomic_write_json(out / STORE_FILE, meta)
