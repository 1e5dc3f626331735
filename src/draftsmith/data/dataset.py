"""The tokenized dataset that `prepare` writes and every later stage reads.

Folder layout:
    data.parquet   one row per sample: sample_id int64 (0..N-1, stable), input_ids list<int32>,
                   loss_mask list<uint8> (1 = assistant token), length int32
    dataset.json   {"format": "draftsmith-dataset", "version": 1, "target": {...}, "max_len": ..}
    stats.json     what `prepare` kept, dropped and why; token counts; length histogram
    run.yaml       the resolved config and command

    ds = load_dataset(path)
    ds[i] -> {"sample_id": int, "input_ids": LongTensor [T], "loss_mask": LongTensor [T]}
    ds.lengths -> np.ndarray [N]
    split_indices(N, val_fraction, seed) -> (train, validation) indices, as `train` splits
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from draftsmith.errors import UserError, naming

DATA_FILE, META_FILE, STATS_FILE = "data.parquet", "dataset.json", "stats.json"
FORMAT = "draftsmith-dataset"

SCHEMA = pa.schema(
    [
        ("sample_id", pa.int64()),
        ("input_ids", pa.list_(pa.int32())),
        ("loss_mask", pa.list_(pa.uint8())),
        ("length", pa.int32()),
    ]
)


class TokenizedDataset:
    """Random access over a prepared dataset. Columns are held as flat numpy arrays plus
    offsets, so indexing is O(1) and costs no Python object per token."""

    def __init__(self, path: Path, table: pa.Table, meta: dict[str, Any]) -> None:
        self.path, self.meta = path, meta
        ids_col = table.column("input_ids").combine_chunks()
        mask_col = table.column("loss_mask").combine_chunks()
        self.offsets = ids_col.offsets.to_numpy()  # [N+1]
        self.ids = ids_col.values.to_numpy()  # [total] int32
        self.mask = mask_col.values.to_numpy()  # [total] uint8
        self.sample_ids = table.column("sample_id").to_numpy()
        self.lengths = table.column("length").to_numpy().astype(np.int64)
        redo = f"run `draftsmith prepare DATA --out {path} --overwrite` again"
        if len(mask_col.offsets) != len(self.offsets) or not (
            np.array_equal(np.diff(self.offsets), self.lengths)
            and np.array_equal(mask_col.offsets.to_numpy(), self.offsets)
        ):
            raise UserError(
                f"{path / DATA_FILE}: its lengths, input_ids and loss_mask disagree (edited by hand?); {redo}"
            )
        if self.ids.size and int(self.ids.min()) < 0:
            raise UserError(f"{path / DATA_FILE}: holds a negative token id ({int(self.ids.min())}); {redo}")

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> dict[str, Any]:
        a, b = self.offsets[i], self.offsets[i + 1]
        return {
            "sample_id": int(self.sample_ids[i]),
            "input_ids": torch.from_numpy(self.ids[a:b].astype(np.int64)),  # [T]
            "loss_mask": torch.from_numpy(self.mask[a:b].astype(np.int64)),  # [T]
        }

    @property
    def target(self) -> dict[str, Any]:
        return self.meta.get("target", {})

    def fingerprint(self) -> str:
        """A short hash of the content (sample ids, lengths, token ids, loss masks): the same
        for a copy or a re-run of `prepare` on the same input, different for any other data."""
        h = hashlib.sha256()
        for column, dtype in (
            (self.sample_ids, np.int64),
            (self.lengths, np.int64),
            (self.ids, np.int32),
            (self.mask, np.uint8),
        ):
            h.update(np.ascontiguousarray(column, dtype=dtype).data)  # no copy when already so
        return h.hexdigest()[:16]


def pad_batch(
    ds: TokenizedDataset, rows: list[int], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """Right-padded ids and attention mask [B, T_max] of the dataset's `rows` on `device`, and
    the per-row lengths: a capture batch (`extract`, and `plan`'s calibration)."""
    lengths = [int(ds.lengths[r]) for r in rows]
    ids = np.zeros((len(rows), max(lengths)), dtype=np.int64)
    mask = np.zeros_like(ids)
    for j, r in enumerate(rows):
        a, b = ds.offsets[r], ds.offsets[r + 1]
        ids[j, : b - a] = ds.ids[a:b]
        mask[j, : b - a] = 1
    pin = device.type == "cuda"
    t_ids, t_mask = torch.from_numpy(ids), torch.from_numpy(mask)
    if pin:
        t_ids, t_mask = t_ids.pin_memory(), t_mask.pin_memory()
    return t_ids.to(device, non_blocking=pin), t_mask.to(device, non_blocking=pin), lengths


def split_indices(n: int, val_fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """Deterministic split: a seeded permutation, the last round(n*f) samples (at least one
    when f > 0 and n > 1) held out for validation."""
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    n_val = min(max(round(n * val_fraction), 1 if val_fraction > 0 and n > 1 else 0), n - 1)
    return sorted(perm[: n - n_val]), sorted(perm[n - n_val :])


def load_dataset(path: Path) -> TokenizedDataset:
    path = Path(path)
    if not path.exists():
        raise UserError(f"{path}: no such dataset folder")
    if not (path / DATA_FILE).exists() or not (path / META_FILE).exists():
        raise UserError(
            f"{path} is not a prepared dataset (no {DATA_FILE}/{META_FILE}); "
            f"run `draftsmith prepare DATA --out {path}` first"
        )
    redo = f"run `draftsmith prepare DATA --out {path} --overwrite` again"
    try:
        meta = json.loads((path / META_FILE).read_text(encoding="utf-8"))
    except ValueError as e:  # not JSON, or not UTF-8
        raise UserError(f"{path / META_FILE}: corrupt ({e}); {redo}") from None
    fmt = meta.get("format") if isinstance(meta, dict) else None
    if fmt != FORMAT:
        raise UserError(f"{path / META_FILE}: not a draftsmith dataset (format {fmt!r})")
    try:
        table = pq.read_table(path / DATA_FILE)
    except (pa.ArrowException, OSError) as e:
        if isinstance(e, pa.ArrowMemoryError) or "malloc of size" in str(e) or "launch worker thread" in str(e):
            raise MemoryError(f"reading {path / DATA_FILE}: {e}") from None  # `ulimit -v`: not a corrupt file
        raise UserError(f"{path / DATA_FILE}: corrupt or truncated ({e}); {redo}") from None
    if not set(SCHEMA.names) <= set(table.column_names):
        raise UserError(f"{path / DATA_FILE}: columns {table.column_names}, expected {SCHEMA.names}; {redo}")
    return TokenizedDataset(path, table, meta)


def write_table(path: Path, rows: dict[str, list]) -> None:
    """Write the parquet file from column lists (sample_id, input_ids, loss_mask, length)."""
    table = pa.table(rows, schema=SCHEMA)
    try:
        pq.write_table(table, path / DATA_FILE)
    except OSError as e:  # pyarrow names no file
        raise naming(e, path / DATA_FILE) from None


def trainable_tokens(ds: TokenizedDataset, rows: list[int], max_len: int, first: int, all_tokens: bool) -> int:
    """How many tokens of the dataset's `rows` a training run learns to draft: those at position
    `first` or later (a drafter predicts a token from the states of earlier ones: EAGLE-3's first
    target is the third token) within the first `max_len` of their sample, and (unless
    `all_tokens`) marked in the loss mask."""
    if not len(rows) or not ds.ids.size:
        return 0
    pos = np.arange(ds.ids.size) - np.repeat(ds.offsets[:-1], ds.lengths)  # position within its sample
    ok = (pos >= first) & (pos < max_len) & (True if all_tokens else ds.mask.astype(bool))
    cum = np.concatenate([[0], np.cumsum(ok, dtype=np.int64)])
    per_sample = cum[ds.offsets[1:]] - cum[ds.offsets[:-1]]
    return int(per_sample[np.asarray(rows, dtype=np.int64)].sum())


def check_trainable(ds: TokenizedDataset, rows: list[int], max_len: int, first: int, all_tokens: bool) -> int:
    """`trainable_tokens`, or a UserError before a run starts that would train on nothing (its
    loss 0 at every step, and a drafter published that never learnt)."""
    n = trainable_tokens(ds, rows, max_len, first, all_tokens)
    if n == 0:
        masked = int(ds.mask.sum()) == 0 and not all_tokens
        why = (
            "its loss masks are all zero (no assistant tokens: a completion dataset, or a chat template without "
            "answers?); give --loss-tokens all to train on every token, or prepare data with answers"
            if masked
            else f"no sample has a trained token at position {first} or later within the first {max_len} tokens; "
            "give a larger --batch-tokens and --max-len (rows of at least a few tokens)"
        )
        raise UserError(f"{ds.path}: nothing to train on in the {len(rows)} training samples: {why}")
    return n


def tokenizer_id(tokenizer: Any) -> str:
    """An id of a tokenizer's vocabulary (its tokens and their ids, added ones too): two
    targets of one id read a dataset's token ids as the same text."""
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    return hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode()).hexdigest()[:16]


def check_tokenizer(ds: TokenizedDataset, tokenizer: Any, spec: str) -> None:
    """Refuse a dataset tokenized with another vocabulary than `--target`'s (its ids would be
    other text to this target). A dataset prepared before tokenizers were recorded is not checked."""
    recorded = ds.target.get("tokenizer")
    if recorded is None or recorded == tokenizer_id(tokenizer):
        return
    raise UserError(
        f"{ds.path} was tokenized for target {ds.target.get('name')!r}, whose tokenizer is not --target {spec}'s "
        f"(another vocabulary: its token ids are other text to this target); prepare the conversations again "
        f"with `draftsmith prepare DATA --target {spec} --out NEW_DATASET`, or give the dataset's own --target"
    )
