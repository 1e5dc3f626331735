"""`draftsmith vocab`: the draft vocabulary, the `--draft-vocab-size` most frequent assistant
tokens. The one builder: `train` calls it too when it is given no vocab file.

Semantics (the same as EAGLE-3, SpecForge and speculators), for a draft vocab of size Vd:
    d2t [Vd] int64: target id = draft id + d2t[draft id]   (draft ids sorted by target id)
    t2d [V] bool:   True where a target id is in the draft vocab; t2d.sum() == Vd

Ranking: count of loss-masked (assistant) tokens descending, then target id ascending. Padding
rule: when the data has fewer than Vd distinct assistant tokens, the remaining slots go to the
lowest unseen target ids, so the vocab always has exactly Vd entries.

Stored as safetensors (`d2t`, `t2d`) with metadata (`draft_vocab_size` = Vd, dataset, target,
coverage), plus `<out>.run.yaml` next to it.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save

from draftsmith.config import write_run_record
from draftsmith.data.config import VocabConfig
from draftsmith.data.dataset import TokenizedDataset, load_dataset
from draftsmith.errors import UserError, from_os_error, naming
from draftsmith.fsutil import atomic_write_bytes, check_output, read_safetensors

DEFAULT_SIZE = 32000  # the draft vocab size when none is given, capped at the target vocab
MIN_SIZE = 2  # a draft vocab of one token makes the loss 0 at every position: nothing is learned


def draft_vocab_size(size: int | None, vocab_size: int) -> int:
    """The draft vocab size of `--draft-vocab-size` (`size`) for a target of `vocab_size` tokens:
    `size` when given, else min(DEFAULT_SIZE, vocab_size); one larger than the target's is refused,
    and so is a degenerate one (`check_size`)."""
    if size is not None and size > vocab_size:
        raise UserError(
            f"--draft-vocab-size {size} is larger than the target's vocab ({vocab_size} tokens): give at most {vocab_size}"
        )
    return check_size(size if size is not None else min(DEFAULT_SIZE, vocab_size), "--draft-vocab-size")


def check_size(size: int, where: str) -> int:
    """A draft vocab of at least MIN_SIZE tokens, or a UserError saying why (`where`: the option or file)."""
    if size < MIN_SIZE:
        raise UserError(
            f"{where}: a draft vocab of {size} token(s) cannot be trained: the drafter's softmax over one "
            f"token is 1 everywhere, so the loss is 0 and nothing is learned; give at least {MIN_SIZE} "
            f"(default min({DEFAULT_SIZE}, the target's vocab))"
        )
    return size


def build_vocab(counts: np.ndarray | torch.Tensor, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """counts [V]: loss-masked token frequencies. Returns (d2t [size] int64, t2d [V] bool).

    Ties and unseen tokens: ordered by count descending, then by target id ascending, so when
    fewer than `size` distinct tokens occur the vocab is padded with the lowest unseen ids.
    """
    counts = torch.as_tensor(np.asarray(counts), dtype=torch.int64)
    vocab_size = counts.numel()
    if not 0 < size <= vocab_size:
        raise UserError(f"draft vocab size {size} must be in 1..{vocab_size} (the target vocab)")
    ids = torch.arange(vocab_size)
    order = torch.from_numpy(np.lexsort((ids.numpy(), -counts.numpy())))  # count desc, id asc
    chosen = order[:size].sort().values  # [size] target ids, ascending
    d2t = chosen - torch.arange(size)  # [size] offsets
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[chosen] = True
    return d2t, t2d


def save_vocab(path: Path, d2t: torch.Tensor, t2d: torch.Tensor, meta: dict[str, str] | None = None) -> None:
    """Written atomically (nothing left behind on a failure) with the normal file mode; a failed
    write (a full disk) raises an OSError naming `path`."""
    try:
        atomic_write_bytes(Path(path), save({"d2t": d2t.contiguous(), "t2d": t2d.contiguous()}, metadata=meta or {}))
    except OSError as e:
        raise naming(e, path) from None


def load_vocab(path: Path) -> tuple[torch.Tensor, torch.Tensor]:
    path = Path(path)
    if not path.exists():
        raise UserError(f"vocab file {path}: no such file; make one with `draftsmith vocab`")
    fix = "make it again with `draftsmith vocab DATASET_DIR --out FILE`"
    t = read_safetensors(path, fix)
    if "d2t" not in t or "t2d" not in t:
        raise UserError(f"{path}: not a draft vocab file (needs d2t and t2d tensors); {fix}")
    d2t, t2d = t["d2t"], t["t2d"]
    if d2t.ndim != 1 or t2d.ndim != 1 or t2d.dtype != torch.bool or d2t.dtype.is_floating_point:
        raise UserError(
            f"{path}: d2t must be 1-D integer offsets and t2d a 1-D bool mask "
            f"(got d2t {d2t.dtype} {list(d2t.shape)}, t2d {t2d.dtype} {list(t2d.shape)}); {fix}"
        )
    target_ids = d2t.long() + torch.arange(len(d2t))  # [Vd] the target id of each draft id
    if len(target_ids) and (
        int(target_ids.min()) < 0
        or int(target_ids.max()) >= len(t2d)
        or not torch.equal(t2d.nonzero().flatten(), target_ids)
    ):
        raise UserError(
            f"{path}: d2t and t2d disagree (d2t must map draft id i to the i-th target id that t2d marks); {fix}"
        )
    check_size(len(d2t), str(path))
    return d2t, t2d


def token_counts(ds: TokenizedDataset, vocab_size: int, rows: list[int] | None = None) -> np.ndarray:
    """[vocab_size] int64 counts of the loss-masked (assistant) tokens of a prepared dataset, over
    the dataset rows `rows` (all rows when None)."""
    keep = ds.mask.astype(bool)  # [total tokens]
    if rows is not None:
        member = np.zeros(len(ds), dtype=bool)  # [samples]
        member[rows] = True
        keep &= np.repeat(member, ds.lengths)  # [total tokens]
    ids = ds.ids[keep]  # [n_assistant]
    if ids.size and int(ids.max()) >= vocab_size:
        raise UserError(
            f"{ds.path}: token id {int(ids.max())} is outside the target vocab ({vocab_size}); re-run prepare"
        )
    return np.bincount(ids, minlength=vocab_size).astype(np.int64)


def run(cfg: VocabConfig) -> Path:
    if cfg.out.is_dir():
        raise UserError(f"--out {cfg.out} is a folder; give a file path such as {cfg.out / 'vocab.safetensors'}")
    out = check_output(cfg.out, "vocab", [cfg.dataset_dir], folder=False)  # the real path of a symbolic link
    if out.exists() and not cfg.overwrite:
        raise UserError(f"{cfg.out} already exists; pass --overwrite to replace it")
    ds = load_dataset(cfg.dataset_dir)
    vocab_size = int(ds.target.get("vocab_size") or 0)
    if vocab_size <= 0:
        raise UserError(f"{cfg.dataset_dir}: dataset.json has no target vocab_size; re-run `draftsmith prepare`")
    size = draft_vocab_size(cfg.draft_vocab_size, vocab_size)
    counts = token_counts(ds, vocab_size)
    d2t, t2d = build_vocab(counts, size)
    total, distinct = int(counts.sum()), int((counts > 0).sum())
    covered = int(counts[t2d.numpy()].sum())
    coverage = covered / total if total else 0.0
    try:
        save_vocab(
            out,
            d2t,
            t2d,
            meta={
                "draft_vocab_size": str(size),
                "target_vocab": str(vocab_size),
                "dataset": str(cfg.dataset_dir),
                "target": json.dumps(ds.target),
                "assistant_tokens": str(total),
                "coverage": f"{coverage:.6f}",
            },
        )
        write_run_record(out.parent, cfg, name=f"{out.name}.run.yaml")
    except OSError as e:  # a full disk: exit 4, no temporary file left
        raise from_os_error(
            e, f"{out} was not written (a file there before is unchanged): run the same command again"
        ) from None
    padded = max(size - distinct, 0)
    print(
        f"[vocab] {cfg.out}: {size} draft tokens of target vocab {vocab_size}; {distinct} distinct assistant tokens in "
        f"{total} ({len(ds)} samples); the draft vocab covers {coverage:.2%} of assistant tokens"
        + (f"; padded with {padded} unseen ids (lowest ids first)" if padded else "")
    )
    return cfg.out
