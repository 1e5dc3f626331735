"""`draftsmith plan`: disk, memory and time estimates for extract and train, before running them.

Disk comes from the store format (`projected_bytes`) and the dataset's token count, checked
against the free space where the store would go (`store_fit`, extract's own check). Memory comes
from the target's and the drafter's parameter counts and the batch sizes (extract's host slots,
`HOST_SLOTS`), and on CPU the eager TTT attention's O(T²) scores over one training row
(`draft.shape.eager_attention_bytes`, which `train` also checks before it starts). Time comes
from a short measured calibration: a capture forward of the target on a few of the dataset's own
samples, and one forward+backward of train's own step (its `OBJECTIVES`: the drafter and
objective `train --method` builds) over a row of random target states (`--no-calibrate` skips
it and leaves times out). `plan` reads train/'s tables, so it sits beside the pipeline, above
the stages (docs/architecture.md).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

from draftsmith.data.dataset import load_dataset, pad_batch
from draftsmith.data.store import HOST_SLOTS, length_batches, projected_bytes, store_fit
from draftsmith.data.vocab import build_vocab, draft_vocab_size, token_counts
from draftsmith.draft.methods import METHODS
from draftsmith.draft.shape import default_backend, eager_attention_bytes
from draftsmith.fsutil import human_bytes
from draftsmith.layers import resolve_aux_layers
from draftsmith.plan.config import PlanConfig
from draftsmith.progress import fmt_duration
from draftsmith.runtime.capture import capture
from draftsmith.runtime.head import output_head
from draftsmith.target import load_target, text_config
from draftsmith.train.config import TrainConfig, requested_layers
from draftsmith.train.objectives import OBJECTIVES, Objective

ADAM_BYTES_PER_PARAM = 16  # fp32 weight + grad + two AdamW moments


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device: torch.device, repeats: int = 2) -> float:
    """Seconds per call of `fn` after one warm-up call."""
    fn()
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    _sync(device)
    return (time.perf_counter() - t0) / repeats


def calibration_rows(lengths: np.ndarray, max_tokens: int) -> list[int]:
    """A few samples of typical length whose padded batch fits `max_tokens`."""
    order = np.argsort(np.abs(lengths - np.median(lengths)), kind="stable")[:64]  # the most typical lengths
    return [int(order[i]) for i in length_batches(lengths[order], max_tokens)[0]]


def training_config(cfg: PlanConfig) -> TrainConfig:
    """The `train` options this plan stands for: its method, depth, drafter shape and rows, and
    under --paper-settings the paper's values of the options not given (the step timed eagerly:
    compiling it would take longer than the plan)."""
    same = ("dataset_dir", "target", "method", "depth", "batch_tokens", "draft_vocab_size", "intermediate_size")
    given = {k: getattr(cfg, k) for k in ("num_layers", "paper_settings", "aux_layer_ids") if k in cfg.model_fields_set}
    return TrainConfig(**{k: getattr(cfg, k) for k in same}, **given, out=cfg.dataset_dir)


def calibrate_step(objective: Objective, tokens: int, width: int, target_width: int, device: torch.device) -> float:
    """Seconds for one forward+backward of train's own step (`objective`) over one [1, tokens]
    row of one sample, on random target states (aux [1, T, width], final [1, T, target_width])."""
    aux = torch.randn(1, tokens, width, device=device)  # [1, T, n_aux*H]
    final = torch.randn(1, tokens, target_width, device=device)  # [1, T, H]
    ids = torch.randint(0, objective.drafter.config.vocab_size, (1, tokens), device=device)
    mask = torch.ones(1, tokens, dtype=torch.long, device=device)  # every token trained on
    doc = torch.zeros(1, tokens, dtype=torch.long, device=device)  # one sample
    pos = torch.arange(tokens, device=device)[None]  # [1, T]

    def step() -> None:
        loss, _ = objective(ids, mask, doc, pos, aux, final)
        loss.backward()
        objective.drafter.zero_grad(set_to_none=True)

    return timed(step, device, repeats=1)


def run(cfg: PlanConfig) -> Path:
    ds = load_dataset(cfg.dataset_dir)
    target = load_target(cfg.target, cfg.device, cfg.dtype, shard=cfg.shard)
    info, device = target.info, target.device
    # the drafter train --method would build (train/objectives.py), with the dataset's draft vocab
    training, train_cfg = OBJECTIVES[cfg.method], training_config(cfg)
    aux_layer_ids = resolve_aux_layers(
        requested_layers(train_cfg, info.num_layers), info.num_layers, METHODS[cfg.method].aux_count
    )
    n_aux, H, dsize = len(aux_layer_ids), info.hidden_size, target.dtype.itemsize
    tokens, n = int(ds.lengths.sum()), len(ds)
    weight_bytes = sum(p.numel() * p.element_size() for p in target.model.parameters())
    vocab = draft_vocab_size(cfg.draft_vocab_size, info.vocab_size)
    d2t, t2d = build_vocab(token_counts(ds, info.vocab_size), vocab)
    drafter = training.drafter(target, aux_layer_ids, d2t, t2d, train_cfg).to(device)
    draft_cfg = drafter.config
    trainable = sum(p.numel() for p in drafter.parameters() if p.requires_grad)
    # the weights and optimizer state, and on CPU (eager TTT attention, O(T²)) the row's scores
    backend = default_backend(device)
    eager = training.ttt and backend == "eager"
    scores = eager_attention_bytes(cfg.batch_tokens, draft_cfg.num_attention_heads, cfg.depth, draft_cfg.num_layers)
    drafter_bytes = (
        trainable * ADAM_BYTES_PER_PARAM
        + sum(p.numel() * 4 for p in drafter.parameters() if not p.requires_grad)
        + (scores if eager else 0)
    )

    fwd_tps = drafter_tps = None
    if cfg.calibrate and n:
        rows = calibration_rows(ds.lengths, cfg.calibrate_tokens)
        ids, mask, lengths = pad_batch(ds, rows, device)  # [B, T_max]
        seconds = timed(lambda: capture(target.model, ids, mask, aux_layer_ids), device)
        fwd_tps = sum(lengths) / seconds
        T = min(int(max(lengths)), cfg.calibrate_tokens)
        objective = training.objective(drafter, output_head(target.model), train_cfg, backend)
        drafter_tps = T / calibrate_step(objective, T, n_aux * H, H, device)

    store = projected_bytes(tokens, n, n_aux, H, dsize)
    hidden_dir = Path(cfg.hidden) if cfg.hidden else Path(cfg.dataset_dir).absolute().parent
    fit = store_fit(store, hidden_dir)
    act_bytes = (
        cfg.token_budget
        * ((n_aux + 2) * H + 3 * int(getattr(text_config(target.model.config), "intermediate_size", 4 * H)))
        * dsize
    )
    host_bytes = HOST_SLOTS * cfg.token_budget * (n_aux + 1) * H * dsize
    ckpt_bytes = trainable * ADAM_BYTES_PER_PARAM * 2  # the last two checkpoints are kept

    def eta(rate: float | None, work: float) -> str:
        return fmt_duration(work / rate) if rate else "-"

    rows_out = [
        (
            "extract",
            human_bytes(store),
            human_bytes(host_bytes),
            human_bytes(weight_bytes + act_bytes),
            eta(fwd_tps, tokens),
        ),
        (
            "train (offline)",
            human_bytes(ckpt_bytes),
            "-",
            human_bytes(drafter_bytes),
            eta(drafter_tps, tokens * cfg.epochs),
        ),
        (
            "train (online)",
            human_bytes(ckpt_bytes),
            "-",
            human_bytes(weight_bytes + drafter_bytes),
            eta(1 / (1 / fwd_tps + 1 / drafter_tps) if fwd_tps and drafter_tps else None, tokens * cfg.epochs),
        ),
    ]
    table = Table(
        title=f"draftsmith plan: {n} samples, {tokens} tokens, target {info.name} "
        f"({info.num_layers} layers, H={H}, {str(target.dtype).removeprefix('torch.')}) on {device}"
    )
    for col in ("stage", "disk", "host memory", "device memory", "time"):
        table.add_column(col)
    for row in rows_out:
        table.add_row(*row)
    console = Console()
    console.print(table)
    console.print(
        f"aux layers {aux_layer_ids}; store ~{human_bytes(store / max(tokens, 1))}/token "
        f"(ideal {(n_aux + 1) * H * dsize} B); drafter {trainable / 1e6:.1f}M trainable params"
    )
    if fwd_tps:
        console.print(
            f"calibration on {device}: target capture forward {fwd_tps:,.0f} tok/s, "
            f"drafter {training.step_label(cfg.depth)} step {drafter_tps:,.0f} tok/s (per epoch; train time uses --epochs {cfg.epochs:g})"
        )
    if eager:
        console.print(
            f"train on {device}: eager TTT attention, ~{human_bytes(scores)} of scores at --batch-tokens "
            f"{cfg.batch_tokens} (quadratic in it), in the device memory above"
        )
    verdict = "fits" if fit.fits else "DOES NOT FIT"
    console.print(
        f"disk at {hidden_dir}: store needs ~{human_bytes(fit.need + fit.margin)} with margin, {human_bytes(fit.free)} free: {verdict}"
    )
    return Path(cfg.dataset_dir)
