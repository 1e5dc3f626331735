"""`draftsmith prepare`: conversations in, tokenized dataset (see `dataset.py`) out.

Reads the conversations (`formats.py`), renders each through the target's own chat template
and tokenizes it with an assistant-only loss mask (`chat.py`), or with --completion tokenizes
plain text and prompt/completion pairs with no template (`completion.py`); with --loss-on all
every token carries the loss. It applies the length policy at --max-len, and writes
`data.parquet`, `dataset.json`, `stats.json` and `run.yaml` into a temporary folder that is
renamed into place at the end. Only the tokenizer is loaded, never the weights.

Samples whose assistant tokens all fall beyond --max-len are dropped in either policy (nothing
to train on); every drop is counted by reason in the stats.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from draftsmith.config import write_run_record
from draftsmith.data.chat import check_template_options, tokenize_conversations
from draftsmith.data.completion import tokenize_completions
from draftsmith.data.config import PrepareConfig
from draftsmith.data.dataset import FORMAT, META_FILE, STATS_FILE, tokenizer_id, write_table
from draftsmith.data.sources import answers, mix_card, read_source
from draftsmith.errors import UserError
from draftsmith.fsutil import atomic_output_dir, atomic_write_json
from draftsmith.progress import Progress
from draftsmith.target import fingerprint, load_text_config, load_tokenizer, resolve_spec

DATASET_VERSION = 1


def target_record(spec: str, tokenizer: Any) -> dict[str, Any]:
    """Name, fingerprint and vocab size of a target, without loading its weights. The vocab is
    the model's (config.json, nested text config resolved) where there is one, else the
    tokenizer's (a GGUF's vocab is its tokenizer's)."""
    folder, gguf_file = resolve_spec(spec)
    vocab = len(tokenizer)
    if gguf_file is None:
        vocab = max(vocab, int(load_text_config(spec).vocab_size))
    return {
        "name": spec,
        "fingerprint": fingerprint(folder, gguf_file),
        "vocab_size": vocab,
        "tokenizer": tokenizer_id(tokenizer),
    }


def length_edges(max_len: int) -> list[int]:
    """Histogram bin edges: 0, 32, 64, 128, ... doubling up to max_len."""
    edges, e = [0], 32
    while e < max_len:
        edges.append(e)
        e *= 2
    return [*edges, max_len]


def print_stats(stats: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"prepare: {stats['input']} -> {stats['output']}")
    table.add_column("")
    table.add_column("value", justify="right")
    rows = [
        ("conversations read", stats["samples_in"]),
        ("samples kept", stats["samples_kept"]),
        *((f"dropped: {k}", v) for k, v in stats["dropped"].items()),
        (f"truncated at {stats['max_len']}", stats["truncated"]),
        ("tokens", stats["tokens"]),
        ("assistant tokens", f"{stats['assistant_tokens']} ({stats['assistant_fraction']:.1%})"),
        ("mean / max length", f"{stats['mean_length']:.1f} / {stats['max_length']}"),
        ("samples/s (tokenizing)", f"{stats['throughput']['samples_per_s']:.0f}"),
    ]
    for k, v in rows:
        table.add_row(k, str(v))
    hist = stats["length_histogram"]
    for lo, hi, n in zip(hist["edges"], hist["edges"][1:], hist["counts"]):
        table.add_row(f"  length {lo + 1}-{hi}", str(n))
    Console().print(table)


def columns(ids_parts: list[np.ndarray], mask_parts: list[np.ndarray]) -> dict[str, pa.Array]:
    """The dataset columns from per-sample arrays, built from flat buffers (no per-token objects)."""
    lens = np.array([len(ids) for ids in ids_parts], dtype=np.int32)  # [N]
    offsets = pa.array(np.concatenate([[0], np.cumsum(lens, dtype=np.int64)]).astype(np.int32))  # [N+1]
    return {
        "sample_id": pa.array(np.arange(len(lens), dtype=np.int64)),
        "input_ids": pa.ListArray.from_arrays(offsets, pa.array(np.concatenate(ids_parts))),  # flat [sum T] int32
        "loss_mask": pa.ListArray.from_arrays(offsets, pa.array(np.concatenate(mask_parts))),  # flat [sum T] uint8
        "length": pa.array(lens),
    }


def summarize(
    cfg: PrepareConfig,
    n_in: int,
    lens: np.ndarray,
    assistant: int,
    dropped: dict[str, int],
    truncated: int,
    seconds: float,
    cpu_seconds: float,
) -> dict[str, Any]:
    tokens, edges = int(lens.sum()), length_edges(cfg.max_len)
    return {
        "input": str(cfg.data),
        "output": str(cfg.out),
        "format": cfg.format,
        "max_len": cfg.max_len,
        "length_policy": cfg.length_policy,
        "samples_in": n_in,
        "samples_kept": len(lens),
        "dropped": dropped,
        "truncated": truncated,
        "tokens": tokens,
        "assistant_tokens": assistant,
        "assistant_fraction": assistant / tokens,
        "mean_length": float(lens.mean()),
        "max_length": int(lens.max()),
        "length_histogram": {"edges": edges, "counts": np.histogram(lens, bins=edges)[0].tolist()},
        "throughput": {  # the tokenizing phase: read, render, tokenize, mask (not the tokenizer load)
            "samples_per_s": n_in / seconds,
            "tokens_per_s": tokens / seconds,
            "tokenize_seconds": round(seconds, 3),
            "tokenize_cpu_seconds": round(cpu_seconds, 3),
        },
    }


def tokenize(cfg: PrepareConfig, tokenizer: Any, batch: list[dict[str, Any]]) -> list[tuple[np.ndarray, np.ndarray]]:
    """[(input_ids [T] int32, loss_mask [T] uint8), ...] of a batch of conversations, in the
    mode and with the loss of `cfg`."""
    names = [f"{cfg.data} sample {c['id']}" for c in batch]
    tokenized = tokenize_completions if cfg.completion else tokenize_conversations
    encoded = tokenized(tokenizer, [c["messages"] for c in batch], names=names)
    return [(ids, np.ones_like(mask)) for ids, mask in encoded] if cfg.loss_on == "all" else encoded


def write_dataset(cfg: PrepareConfig, tmp: Path) -> dict[str, Any]:
    """Read, tokenize and write the dataset into the folder `tmp`; returns its stats."""
    if not cfg.completion and not answers(cfg.data):
        raise UserError(
            f"{cfg.data}: a prompt set without answers; answer it first with "
            f"`draftsmith synth {cfg.data} --out FILE.jsonl` and prepare that file"
        )
    convs = read_source(cfg.data, cfg.format).convs
    tokenizer = load_tokenizer(cfg.target, cfg.chat_template)
    target = target_record(cfg.target, tokenizer)

    ids_parts, mask_parts = [], []
    truncated, dropped = 0, {"longer than max_len": 0, "no assistant tokens within max_len": 0}
    started, cpu_started = time.perf_counter(), time.process_time()
    with Progress("prepare", tmp, total=len(convs)) as progress:
        for a in range(0, len(convs), cfg.batch_size):
            batch = convs[a : a + cfg.batch_size]
            n_tokens = 0
            for ids, mask in tokenize(cfg, tokenizer, batch):
                if len(ids) > cfg.max_len:
                    if cfg.length_policy == "drop":
                        dropped["longer than max_len"] += 1
                        continue
                    ids, mask = ids[: cfg.max_len], mask[: cfg.max_len]
                    truncated += 1
                if not mask.any():
                    dropped["no assistant tokens within max_len"] += 1
                    continue
                ids_parts.append(ids)
                mask_parts.append(mask)
                n_tokens += len(ids)
            progress.advance(len(batch), tokens=n_tokens)
    seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
    if not ids_parts:
        fix = "raise --max-len" + (
            " or use --length-policy truncate"
            if cfg.length_policy == "drop"
            else " (samples are truncated already: their assistant turns start after it)"
        )
        raise UserError(f"{cfg.data}: every sample was dropped ({dropped}); {fix}")

    cols = columns(ids_parts, mask_parts)
    top = pc.max(cols["input_ids"].values).as_py()
    if top >= target["vocab_size"]:
        raise UserError(f"token id {top} >= target vocab {target['vocab_size']}: the tokenizer and the model disagree")
    write_table(tmp, cols)
    assistant = int(pc.sum(cols["loss_mask"].values).as_py())
    stats = summarize(cfg, len(convs), cols["length"].to_numpy(), assistant, dropped, truncated, seconds, cpu_seconds)
    atomic_write_json(
        tmp / META_FILE,
        {
            "format": FORMAT,
            "version": DATASET_VERSION,
            "target": target,
            "max_len": cfg.max_len,
            "length_policy": cfg.length_policy,
            "completion": cfg.completion,
            "loss_on": cfg.loss_on,
            "chat_template": None if cfg.completion else tokenizer.chat_template,
            "num_samples": len(ids_parts),
            "source": str(cfg.data),
            "mix": mix_card(cfg.data),  # synth --mix's sources, licenses and counts, for the model card
        },
    )
    atomic_write_json(tmp / STATS_FILE, stats)
    write_run_record(tmp, cfg)
    return stats


def run(cfg: PrepareConfig) -> Path:
    check_template_options(cfg.chat_template, cfg.completion)
    # a full disk: exit 4, nothing left (atomic_output_dir); out of memory: the CLI's error, nothing left
    with atomic_output_dir(cfg.out, "prepare", [cfg.data, cfg.target, cfg.chat_template], cfg.overwrite) as tmp:
        stats = write_dataset(cfg, tmp)
    print_stats(stats)
    return cfg.out
