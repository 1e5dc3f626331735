"""Training data: sequence packing and the two sample sources (the train/validation split is
`data.dataset.split_indices`).

Both sources return the same per-sample tensors, so everything after them is shared code:

    {"input_ids" [T] long, "loss_mask" [T] long, "aux" [T, n_aux*H_t], "final" [T, H_t]}

  - `OfflineSource`: reads them from a hidden-state store (`extract`).
  - `OnlineSource`: runs the target's hook capture (`runtime.capture`) on the tokenized samples,
    under no_grad: a row's samples packed end to end in one forward (padded, length-bucketed
    sub-batches for a model that cannot pack; one sample per forward for a model that cannot
    take a padding mask either), sliced back into samples.

Packing (`pack_rows`): each epoch shuffles the training samples with `seed + epoch` and fills
rows of at most `capacity` tokens (next-fit over a few open rows). A row's samples are laid end
to end (`collate`; for stored samples in the prefetch thread, into pinned memory);
`ttt.doc_and_positions` gives each its own document id and positions, so attention never
crosses samples and no padding is spent between them. The packing is a pure
function of (lengths, seed, epoch), which is what makes the data position resumable.
Under torchrun, rank r takes rows r, r+W, r+2W, ... (cut to a multiple of W).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from draftsmith.data.store import length_batches
from draftsmith.errors import UserError
from draftsmith.runtime.capture import CompiledCapture, capture, packed_positions, packs_sequences, pads_sequences
from draftsmith.train.ttt import doc_and_positions

OPEN_ROWS = 8


def pack_rows(lengths: np.ndarray, indices: list[int], capacity: int, seed: int | None) -> list[list[int]]:
    """Group sample indices into rows of <= capacity tokens (lengths already truncated to
    capacity). seed None: keep the given order (validation)."""
    order = list(indices)
    if seed is not None:
        perm = torch.randperm(len(order), generator=torch.Generator().manual_seed(seed)).tolist()
        order = [order[i] for i in perm]
    rows: list[list[int]] = []
    open_rows: list[tuple[int, list[int]]] = []  # (tokens used, row)
    for i in order:
        n = int(lengths[i])
        slot = next((j for j, (used, _) in enumerate(open_rows) if used + n <= capacity), None)
        if slot is None:
            if len(open_rows) == OPEN_ROWS:
                rows.append(open_rows.pop(0)[1])
            open_rows.append((0, []))
            slot = len(open_rows) - 1
        used, row = open_rows[slot]
        row.append(i)
        open_rows[slot] = (used + n, row)
    rows += [row for _, row in open_rows]
    return rows


def shard_rows(rows: list[list[int]], rank: int, world: int) -> list[list[int]]:
    """This rank's rows; every rank gets the same number."""
    n = len(rows) // world * world
    return rows[rank:n:world]


def collate(samples: list[dict[str, torch.Tensor]], pad_to: int | None, pin: bool = False) -> dict[str, torch.Tensor]:
    """Lay samples end to end in one row, on the samples' own device: {ids, loss_mask, doc, pos
    [1, L]; aux [1, L, n*H]; final [1, L, H]}. `pin`: host tensors go to pinned memory, so that
    `to_device` copies them without blocking (the prefetch thread collates; the step copies)."""
    lengths = [s["input_ids"].shape[0] for s in samples]
    total = max(sum(lengths), pad_to or 0)
    pad = total - sum(lengths)

    def row(x: torch.Tensor) -> torch.Tensor:  # [L, ...] -> [1, L, ...]
        return (x.pin_memory() if pin and x.device.type == "cpu" else x)[None]

    def cat(key: str) -> torch.Tensor:
        x = torch.cat([s[key] for s in samples])  # [sum T, ...]
        if pad:
            x = torch.cat([x, x.new_zeros((pad, *x.shape[1:]))])  # [L, ...]
        return row(x)

    doc, pos = doc_and_positions(lengths, total, samples[0]["aux"].device)  # [L], [L]
    return {
        "ids": cat("input_ids"),
        "loss_mask": cat("loss_mask"),
        "doc": row(doc),
        "pos": row(pos),
        "aux": cat("aux"),
        "final": cat("final"),
    }


def to_device(batch: dict[str, torch.Tensor], device: torch.device | str) -> dict[str, torch.Tensor]:
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


class OfflineSource:
    """Samples from a hidden-state store; index i is the store's i-th sample. A row's files
    (a hundred or more of ~1 MB for 32k-token rows) are read by `READERS` threads at once; file
    reads release the GIL."""

    prefetch = True  # plain file reads: worth overlapping with the step
    READERS = 8

    def __init__(self, reader: Any, max_len: int) -> None:
        self.reader, self.max_len = reader, max_len
        self.lengths = np.minimum(reader.lengths, max_len)
        self._pool = ThreadPoolExecutor(self.READERS, thread_name_prefix="store-reader")

    def __len__(self) -> int:
        return len(self.reader)

    def _read(self, i: int) -> dict[str, torch.Tensor]:
        s, n = self.reader[i], self.max_len
        return {
            "input_ids": s["input_ids"][:n],
            "loss_mask": s["loss_mask"][:n],
            "aux": s["aux_hidden_states"][:n],
            "final": s["final_hidden_states"][:n],
        }

    def samples(self, indices: list[int]) -> list[dict[str, torch.Tensor]]:
        return list(self._pool.map(self._read, indices))


class OnlineSource:
    """Samples from a tokenized dataset, with hidden states captured from the target now.

    A training row's samples are captured packed: laid end to end in rows of at most
    `PACKED_ROW` tokens, positions restarting per sample, one forward for the lot (transformers
    keeps each sample's attention to itself). A model that does not pack (`packs_sequences`,
    checked once here) is captured in length-bucketed, right-padded batches instead, and one
    whose padded batches fail as well (`pads_sequences`) one sample per forward.

    `attention` is the packed forward's attention implementation (`capture`): None, the model's
    own (sdpa: a dense [W, W] mask, every score computed), or "flex_attention" (block by block,
    the blocks between samples skipped). Under flex the row's width is rounded up to a multiple of
    FLEX_WIDTH, so that its compiled kernels see few shapes.

    `compile`: the packed forward runs compiled (`runtime.capture.CompiledCapture`), one row at a
    time, every row as wide as the widest a row can be (PACKED_ROW, or `token_budget` below it;
    wider only for a longer sample), so that it compiles once."""

    PACKED_ROW = 8192  # tokens per packed capture row: its attention costs O(row²), so longer rows are split
    FLEX_WIDTH = 1024  # under flex, packed rows are this many tokens wide, or a multiple of it

    def __init__(
        self,
        dataset: Any,
        model: torch.nn.Module,
        aux_layer_ids: list[int],
        max_len: int,
        token_budget: int,
        attention: str | None = None,
        compile: bool = False,
    ) -> None:
        self.dataset, self.model, self.aux_layer_ids, self.max_len = dataset, model, aux_layer_ids, max_len
        self.token_budget, self.attention = token_budget, attention
        self.device = next(model.parameters()).device
        self.lengths = np.minimum(dataset.lengths, max_len)
        self.packed = packs_sequences(model, aux_layer_ids, attention)
        self.padded = self.packed or pads_sequences(model, aux_layer_ids)
        if not self.packed:
            how = "in padded batches" if self.padded else "one sample per forward (its padded batches fail as well)"
            print(
                f"[train] {type(model).__name__} does not keep packed samples apart in one forward: its hidden "
                f"states are captured {how} instead (slower, same values)",
                flush=True,
            )
        if compile and not self.packed:
            raise UserError(
                f"--compile-capture compiles the packed capture, and {type(model).__name__} cannot be "
                "captured packed; leave --compile-capture out"
            )
        self.compiled = CompiledCapture(model, aux_layer_ids, attention) if compile else None
        self.compiled_once = False  # the compiled capture has run: a failure after it is not the compile's

    def __len__(self) -> int:
        return len(self.dataset)

    def samples(self, indices: list[int]) -> list[dict[str, torch.Tensor]]:
        items = {i: self.dataset[i] for i in indices}
        out: dict[int, dict[str, torch.Tensor]] = {}
        if self.packed:
            self._capture_packed(indices, items, out)
        else:
            lengths = [int(self.lengths[i]) for i in indices]
            for group in length_batches(lengths, self.token_budget, max_batch=None if self.padded else 1):
                self._capture_padded([indices[g] for g in group], items, out)
        return [out[i] for i in indices]

    def _sample(
        self, item: dict[str, torch.Tensor], n: int, aux: torch.Tensor, final: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        return {"input_ids": item["input_ids"][:n], "loss_mask": item["loss_mask"][:n], "aux": aux, "final": final}

    def _capture_packed(self, chosen: list[int], items: dict, out: dict) -> None:
        groups: list[list[int]] = [[]]
        used = 0
        for i in chosen:  # next-fit into rows of <= PACKED_ROW tokens
            n = int(self.lengths[i])
            if groups[-1] and used + n > self.PACKED_ROW:
                groups.append([])
                used = 0
            groups[-1].append(i)
            used += n
        sizes = [[int(self.lengths[i]) for i in g] for g in groups]
        width = max(map(sum, sizes))
        if self.compiled is not None:  # as wide as a group can be: a training row, at most PACKED_ROW
            width = max(width, min(self.PACKED_ROW, self.token_budget))
        if self.attention == "flex_attention":
            width = -(-width // self.FLEX_WIDTH) * self.FLEX_WIDTH
        ids = torch.zeros(len(groups), width, dtype=torch.long)  # [G, W]; a row's tail is a padding "sample"
        pos = torch.zeros(len(groups), width, dtype=torch.long)  # [G, W]: restarting at 0 per sample
        for r, (g, lengths) in enumerate(zip(groups, sizes, strict=True)):
            tail = [width - sum(lengths)] if width > sum(lengths) else []
            ids[r, : sum(lengths)] = torch.cat([items[i]["input_ids"][:n] for i, n in zip(g, lengths, strict=True)])
            pos[r] = packed_positions(lengths + tail)
        ids, pos = ids.to(self.device), pos.to(self.device)
        states = self._compiled_rows(ids, pos) if self.compiled is not None else None
        if states is None:  # all rows in one forward: aux [G, W, n*H], final [G, W, H]
            aux, final = capture(self.model, ids, None, self.aux_layer_ids, pos, self.attention)
            states = list(zip(aux, final, strict=True))  # per row: [W, n*H], [W, H]
        for (aux_r, final_r), g, lengths in zip(states, groups, sizes, strict=True):
            start = 0
            for i, n in zip(g, lengths, strict=True):
                out[i] = self._sample(items[i], n, aux_r[start : start + n], final_r[start : start + n])
                start += n

    def _compiled_rows(self, ids: torch.Tensor, pos: torch.Tensor) -> list[tuple[torch.Tensor, ...]] | None:
        """Each [1, W] row of ids, pos [G, W] through the compiled forward (its one shape): per row
        aux [W, n*H], final [W, H]. A compile that fails (its first call) leaves the capture eager
        from then on, the reason on stdout, and returns None; a later failure is raised."""
        try:
            states = [tuple(x[0] for x in self.compiled(ids[r : r + 1], pos[r : r + 1])) for r in range(len(ids))]
        except Exception as e:  # dynamo's and inductor's errors have no common base
            if self.compiled_once:
                raise
            print(
                f"[train] --compile-capture: the capture's compile failed ({type(e).__name__}: {str(e)[:200]}); "
                "capturing eagerly instead (the same states, slower)",
                flush=True,
            )
            self.compiled = None
            return None
        self.compiled_once = True
        return states

    def _capture_padded(self, chosen: list[int], items: dict, out: dict) -> None:
        width = max(int(self.lengths[i]) for i in chosen)
        ids = torch.zeros(len(chosen), width, dtype=torch.long)  # [b, W], right-padded
        mask = torch.zeros(len(chosen), width, dtype=torch.long)
        for r, i in enumerate(chosen):
            n = int(self.lengths[i])
            ids[r, :n], mask[r, :n] = items[i]["input_ids"][:n], 1
        aux, final = capture(
            self.model, ids.to(self.device), mask.to(self.device), self.aux_layer_ids
        )  # [b, W, n*H], [b, W, H]
        for r, i in enumerate(chosen):
            n = int(self.lengths[i])
            out[i] = self._sample(items[i], n, aux[r, :n], final[r, :n])
