"""The hidden-state store on disk: its layout, its manifest, and `StoreReader`. `extract` writes
it (extract/writer.py), offline `train` reads it; the layout, checksums and byte projection are
in docs/extract.md ("Store format").

    store.json, manifest.jsonl (manifest.rank{r}.jsonl under torchrun)
    rows_{a}-{b}/{sample_id}.safetensors   input_ids [T] int32, loss_mask [T] uint8,
                                           aux_hidden_states [T, n_aux*H], final_hidden_states [T, H]

Readers take manifest lines, never a directory listing: a file is listed only once complete.

    check_store_matches(Path("hidden"), dataset, target.info)   # made from this dataset and target?
    reader = StoreReader(Path("hidden"))
    reader[0]            # {"sample_id", "input_ids", "loss_mask", "aux_hidden_states", "final_hidden_states"}
    for batch in length_batches(reader.lengths, token_budget=16384, seed=epoch):
        samples = [reader[i] for i in batch]
"""

from __future__ import annotations

import json
import os
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load as load_bytes

from draftsmith.errors import UserError
from draftsmith.fsutil import atomic_write_text, free_bytes, lock_holder, read_jsonl
from draftsmith.layers import validate_layers
from draftsmith.target import same_target

if TYPE_CHECKING:
    from draftsmith.data.dataset import TokenizedDataset
    from draftsmith.target import TargetInfo

FORMAT = "draftsmith-hidden-store"
VERSION = 1
STORE_FILE = "store.json"
MANIFEST = "manifest.jsonl"
FOLDER_SIZE = 2000  # samples per rows_{a}-{b} folder
TENSOR_KEYS = ("input_ids", "loss_mask", "aux_hidden_states", "final_hidden_states")
REEXTRACT = "rerun the same `draftsmith extract` command: it extracts again every sample whose file is missing"


FILE_OVERHEAD = 4096  # bytes per sample file beyond its tensors: header, manifest line, block rounding
MARGIN_FRACTION, MARGIN_BYTES = 0.05, 1 << 20  # free space must exceed the projection by this much
HOST_SLOTS = 3  # batches extract holds in host memory between the GPU and its writer threads (pinned on GPU)


def projected_bytes(tokens: int, n_files: int, n_aux: int, hidden_size: int, dtype_size: int) -> int:
    """Disk bytes of a store: tokens × ((n_aux+1) × H × dtype_size + 5 for ids and mask) + per-file overhead."""
    return tokens * ((n_aux + 1) * hidden_size * dtype_size + 5) + n_files * FILE_OVERHEAD


@dataclass(frozen=True)
class StoreFit:
    """`need` bytes of store still to write, the `margin` kept for the projection's error, and
    the `free` bytes on the disk that would hold them."""

    need: int
    margin: int
    free: int

    @property
    def fits(self) -> bool:
        return self.need + self.margin <= self.free


def store_fit(need: int, where: Path) -> StoreFit:
    """The one disk check of a store, for `extract` (its preflight and `--plan`) and `plan`:
    `need` bytes plus a margin of 5% and 1 MiB against the free space on the disk holding
    `where` (or its nearest existing parent)."""
    return StoreFit(need, int(need * MARGIN_FRACTION) + MARGIN_BYTES, free_bytes(where))


def sample_relpath(sample_id: int, folder_size: int = FOLDER_SIZE) -> str:
    """`rows_{a}-{b}/{sample_id}.safetensors`, with a..b the folder's inclusive id range."""
    a = (sample_id // folder_size) * folder_size
    return f"rows_{a}-{a + folder_size - 1}/{sample_id}.safetensors"


def rank_manifest_name(rank: int) -> str:
    return f"manifest.rank{rank}.jsonl"


def crc32(data: bytes | memoryview) -> str:
    return f"{zlib.crc32(data) & 0xFFFFFFFF:08x}"


def new_store_meta(
    target: dict[str, Any], aux_layer_ids: list[int], dtype: str, dataset: dict[str, Any]
) -> dict[str, Any]:
    """store.json for a new store; `totals` and `complete` are filled in when extraction ends."""
    return {
        "format": FORMAT,
        "version": VERSION,
        "target": target,
        "aux_layer_ids": list(aux_layer_ids),
        "dtype": dtype,
        "hidden_size": int(target["hidden_size"]),
        "n_aux": len(aux_layer_ids),
        "folder_size": FOLDER_SIZE,
        "checksum": "crc32",
        "dataset": dataset,
        "totals": None,
        "complete": False,
    }


def dataset_identity(dataset: TokenizedDataset) -> dict[str, Any]:
    """What store.json records of the dataset a store is made from: its path (for people),
    sample and token counts, and the fingerprint of its content (what the checks compare)."""
    return {
        "path": str(Path(dataset.path).resolve()),
        "samples": len(dataset),
        "tokens": int(dataset.lengths.sum()),
        "fingerprint": dataset.fingerprint(),
    }


def source_mismatches(meta: dict[str, Any], target: dict[str, Any], dataset: dict[str, Any]) -> list[str]:
    """How a store (its store.json `meta`) differs from a run's target (`TargetInfo.to_dict()`)
    and dataset (`dataset_identity`), one phrase each. A store made before the dataset was
    fingerprinted is compared on what it recorded (sample and token counts)."""
    stored, found = meta["target"], []
    if not same_target(stored["fingerprint"], target["fingerprint"]):
        found.append(
            f"target fingerprint: store made for {stored.get('name')!r} ({stored['fingerprint']}), "
            f"this run has {target.get('name')!r} ({target['fingerprint']})"
        )
    made_from = meta.get("dataset") or {}
    found += [
        f"dataset {key}: store made from {made_from[key]!r}, this run has {dataset[key]!r}"
        for key in ("fingerprint", "samples", "tokens")
        if key in made_from and made_from[key] != dataset[key]
    ]
    return found


def dataset_rows(store: Path, store_ids: list[int], dataset: TokenizedDataset) -> list[int]:
    """The dataset row of each of a store's samples (`store_ids`, the reader's order): offline
    training splits the store's samples, and held-out evaluation finds their prompts."""
    row_of = {int(s): i for i, s in enumerate(dataset.sample_ids)}
    missing = [s for s in store_ids if s not in row_of]
    if missing:
        raise UserError(
            f"store {store} holds samples {missing[:5]} that the dataset {dataset.path} lacks: "
            "give the dataset the store was extracted from"
        )
    return [row_of[s] for s in store_ids]


def check_store_matches(store: Path, dataset: TokenizedDataset, target: TargetInfo) -> None:
    """Refuse a store that was not extracted from `dataset` with `target` (its hidden states
    would not belong to the tokens they are trained with), or at layer ids no engine serves."""
    meta = read_store_meta(store)
    found = source_mismatches(meta, target.to_dict(), dataset_identity(dataset))
    if found:
        made_from = (meta.get("dataset") or {}).get("path", "not recorded")
        raise UserError(
            f"store {store} was not made from the dataset {dataset.path} with this target ({'; '.join(found)}). "
            f"Give the dataset (it was {made_from}) and --target the store was extracted from, or extract "
            f"a new store from this dataset with this target"
        )
    try:
        validate_layers(meta.get("aux_layer_ids") or [], target.num_layers, count=None)  # any drafter's
    except UserError as e:  # a store written before the layer rule
        raise UserError(f"store {store}: {e}; extract a new store with such --aux-layer-ids") from None


def check_store_ready(store: Path, partial: bool = False) -> None:
    """Refuse a store that does not hold what it claims: one that `extract` is still writing (its
    output lock is held) or one marked incomplete (an extraction stopped before the end). With
    `partial` (train's --partial-store) it is used as it stands, and one line says so."""
    meta = read_store_meta(store)
    holder = lock_holder(Path(store))
    total = (meta.get("dataset") or {}).get("samples")
    if holder is not None:
        how = f"is being written by `draftsmith extract` (pid {holder})"
        fix = "wait for the extraction to finish (`draftsmith status STORE`)"
    elif meta.get("complete", True) is False:
        how = "is incomplete (its extraction stopped before the end)"
        fix = "rerun the same `draftsmith extract` to finish it"
    else:
        return
    held = len(read_manifest(store))
    count = f"{held} of {total} samples" if total is not None else f"{held} samples"
    if partial:
        print(f"[train] --partial-store: store {store} {how}; training on the {count} it holds now", flush=True)
        return
    raise UserError(
        f"store {store} {how}: it holds {count}. {fix[0].upper()}{fix[1:]}, or pass --partial-store to train "
        "on the samples it holds now"
    )


def read_store_meta(path: Path) -> dict[str, Any]:
    """store.json of a store folder, or a UserError saying why `path` is not a store."""
    path = Path(path)
    meta_file = path / STORE_FILE
    if not meta_file.exists():
        raise UserError(f"{path} is not a hidden-state store (no {STORE_FILE}); make one with `draftsmith extract`")
    try:
        meta = json.loads(meta_file.read_text())
    except json.JSONDecodeError as e:
        raise UserError(f"{meta_file}: not valid JSON ({e.msg})") from None
    if meta.get("format") != FORMAT:
        raise UserError(f"{meta_file}: not a draftsmith hidden-state store (format {meta.get('format')!r})")
    if meta.get("version") != VERSION:
        raise UserError(
            f"{meta_file}: store format version {meta.get('version')} is not supported (expected {VERSION})"
        )
    if "layers" in meta:  # stores written before the rename name their aux layer ids "layers"
        meta["aux_layer_ids"] = meta.pop("layers")
    return meta


def manifest_files(path: Path) -> list[Path]:
    """manifest.jsonl plus any per-rank manifests not merged yet."""
    path = Path(path)
    files = [path / MANIFEST] if (path / MANIFEST).exists() else []
    return files + sorted(path.glob("manifest.rank*.jsonl"))


def repair_manifest(path: Path) -> None:
    """Cut a torn trailing line (an append cut short by a crash) so later appends start on a
    fresh line. Reads only the file's tail."""
    with open(path, "rb+") as f:
        size = f.seek(0, 2)
        if size == 0:
            return
        tail_start = max(0, size - 65536)
        f.seek(tail_start)
        tail = f.read()
        if tail.endswith(b"\n"):
            return
        cut = tail.rfind(b"\n")
        f.truncate(tail_start + cut + 1 if cut >= 0 else 0)


def read_manifest(path: Path) -> dict[int, dict[str, Any]]:
    """sample_id -> manifest entry over all manifest files of a store (first entry wins, so a
    sample listed twice, e.g. by a merge cut short, counts once). No sample file is opened."""
    entries: dict[int, dict[str, Any]] = {}
    for f in manifest_files(path):
        for lineno, entry in read_jsonl(f):
            if not isinstance(entry, dict) or not {"sample_id", "path", "tokens", "crc32"} <= entry.keys():
                raise UserError(f"{f}:{lineno}: not a manifest entry; remove that line and rerun extract")
            entries.setdefault(int(entry["sample_id"]), entry)
    return entries


def write_manifest(path: Path, entries: dict[int, dict[str, Any]]) -> None:
    """Replace all manifests of a store with one manifest.jsonl listing `entries` (an atomic
    rewrite; the per-rank manifests are removed after it)."""
    path = Path(path)
    stale = [f for f in manifest_files(path) if f.name != MANIFEST]
    lines = [json.dumps(entries[s], separators=(",", ":")) + "\n" for s in sorted(entries)]
    atomic_write_text(path / MANIFEST, "".join(lines))
    for f in stale:
        f.unlink()


def files_on_disk(path: Path) -> set[str]:
    """The `rows_*/NAME` paths present in a store folder, from directory listings only."""
    found: set[str] = set()
    for folder in Path(path).glob("rows_*"):
        if folder.is_dir():
            with os.scandir(folder) as it:
                found.update(f"{folder.name}/{e.name}" for e in it)
    return found


def check_sample(tensors: dict[str, torch.Tensor], n_aux: int, hidden_size: int, where: str) -> None:
    """Shape checks at the stage boundary: rows == tokens for every tensor."""
    missing = [k for k in TENSOR_KEYS if k not in tensors]
    if missing:
        raise UserError(f"{where}: missing tensors {missing}")
    T = tensors["input_ids"].shape[0]
    expected = {
        "input_ids": (T,),
        "loss_mask": (T,),
        "aux_hidden_states": (T, n_aux * hidden_size),
        "final_hidden_states": (T, hidden_size),
    }
    for key, shape in expected.items():
        if tuple(tensors[key].shape) != shape:
            raise UserError(f"{where}: {key} has shape {tuple(tensors[key].shape)}, expected {shape}")


def length_batches(
    lengths: np.ndarray | list[int],
    token_budget: int,
    shuffle: bool = False,
    seed: int = 0,
    max_batch: int | None = None,
) -> list[list[int]]:
    """Group indices into length-bucketed batches whose padded size (count × longest) fits
    `token_budget`; a sample longer than the budget gets a batch of its own.

    Indices are sorted by length (stable), so each batch holds similar lengths and padding is
    small. With `shuffle`, the order of batches (not their content) is permuted with `seed`.
    Returns a list of index lists into `lengths`.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    order = np.argsort(lengths, kind="stable")
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i in order.tolist():
        n = int(lengths[i])
        grown = max(longest, n) * (len(current) + 1)
        if current and (grown > token_budget or (max_batch is not None and len(current) >= max_batch)):
            batches.append(current)
            current, longest = [], 0
        current.append(i)
        longest = max(longest, n)
    if current:
        batches.append(current)
    if shuffle:
        perm = np.random.default_rng(seed).permutation(len(batches))
        batches = [batches[j] for j in perm]
    return batches


class StoreReader:
    """Random access over a finished (or partly finished) store.

    meta: store.json; sample_ids: list[int] (ascending); lengths: np.ndarray [N] tokens per
    sample, both from the manifest without opening any sample file.
    `reader[i]` loads the i-th listed sample; `reader.get(sample_id)` by id.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.meta = read_store_meta(self.path)
        entries = read_manifest(self.path)
        self.sample_ids: list[int] = sorted(entries)
        self._entries = [entries[s] for s in self.sample_ids]
        self._index = {s: i for i, s in enumerate(self.sample_ids)}
        self.lengths = np.array([int(e["tokens"]) for e in self._entries], dtype=np.int64)  # [N]
        self.n_aux = int(self.meta["n_aux"])
        self.hidden_size = int(self.meta["hidden_size"])

    def __len__(self) -> int:
        return len(self.sample_ids)

    def file(self, i: int) -> Path:
        return self.path / self._entries[i]["path"]

    def __getitem__(self, i: int) -> dict[str, Any]:
        if not -len(self) <= i < len(self):
            raise IndexError(i)
        entry = self._entries[i]
        f = self.path / entry["path"]
        try:
            # read() the bytes now, not an mmap (safetensors' load_file): the training prefetch
            # thread then really does the I/O, and a later page fault on the main thread (slow on
            # some filesystems) or a file rewritten under a live mapping cannot happen
            data = f.read_bytes()
        except OSError as e:
            raise UserError(f"{f}: cannot read sample {entry['sample_id']} ({e.strerror}); {REEXTRACT}") from None
        if crc32(data) != entry["crc32"]:
            raise UserError(
                f"{f}: sample {entry['sample_id']} is corrupt (checksum {crc32(data)}, the manifest says "
                f"{entry['crc32']}); delete the file and {REEXTRACT}"
            )
        try:
            t = load_bytes(data)
        except Exception as e:  # safetensors raises its own error type on a bad header
            raise UserError(
                f"{f}: cannot read sample {entry['sample_id']} ({e}); delete the file and {REEXTRACT}"
            ) from None
        check_sample(t, self.n_aux, self.hidden_size, str(f))
        if t["input_ids"].shape[0] != int(entry["tokens"]):
            raise UserError(f"{f}: {t['input_ids'].shape[0]} rows but the manifest says {entry['tokens']} tokens")
        return {
            "sample_id": int(entry["sample_id"]),
            "input_ids": t["input_ids"].long(),  # [T]
            "loss_mask": t["loss_mask"].long(),  # [T]
            "aux_hidden_states": t["aux_hidden_states"],  # [T, n_aux*H]
            "final_hidden_states": t["final_hidden_states"],  # [T, H]
        }

    def check_files(self, read_all_below: int = 1 << 30) -> None:
        """Before a run that reads the store writes anything: every listed file is there with the
        size its manifest line gives (one stat per file), and, for a store of at most
        `read_all_below` bytes (read in about a second), every checksum too. A UserError names the
        first bad file; a larger store's checksums are verified as each sample is read."""
        sizes = [e.get("bytes") for e in self._entries]
        for i, (entry, size) in enumerate(zip(self._entries, sizes, strict=True)):
            f = self.file(i)
            try:
                on_disk = f.stat().st_size
            except OSError as e:
                raise UserError(
                    f"{f}: sample {entry['sample_id']} is listed in the manifest but cannot be read "
                    f"({e.strerror}); {REEXTRACT}"
                ) from None
            if size is not None and on_disk != int(size):
                raise UserError(
                    f"{f}: sample {entry['sample_id']} is {on_disk} bytes but the manifest says {size}: "
                    f"truncated or overwritten; delete the file and {REEXTRACT}"
                )
        if all(s is not None for s in sizes) and sum(int(s) for s in sizes) <= read_all_below:
            for i in range(len(self)):
                self[i]  # the checksum, header and shapes of every sample

    def get(self, sample_id: int) -> dict[str, Any]:
        if sample_id not in self._index:
            raise KeyError(f"sample {sample_id} is not in the store {self.path}")
        return self[self._index[sample_id]]

    def verify(self, i: int) -> None:
        """Full check of one file: what every read checks (checksum against the manifest,
        shapes), plus its metadata and finite values."""
        entry, f = self._entries[i], self.file(i)
        s = self[i]
        with safe_open(str(f), framework="pt") as sf:
            file_meta = sf.metadata() or {}
        if (
            not same_target(self.meta["target"]["fingerprint"], file_meta.get("fingerprint", ""))
            or int(file_meta.get("sample_id", -1)) != entry["sample_id"]
        ):
            raise UserError(f"{f}: metadata {file_meta} does not match the store")
        for key in ("aux_hidden_states", "final_hidden_states"):
            if not torch.isfinite(s[key]).all():
                raise UserError(f"{f}: {key} holds NaN or Inf")
