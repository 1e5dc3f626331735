"""The training loop: micro-batches of packed rows, gradient accumulation, the optimizer and
schedule of `optim.py`, gradient clipping, bf16 autocast, metrics, validation each epoch, the
best drafter by validation τ, and resumable checkpoints. A non-finite gradient stops the run
before the optimizer step, a non-finite validation loss before anything is published, and the
weights are checked finite before every save: no NaN drafter or checkpoint is ever written. The
error names the likely cause: the learning rate when an update made the weights non-finite,
else the data.

The data position is (epoch, next row of that epoch's packing); the packing of an epoch is a
pure function of the seed, so a resumed run reads exactly the rows an uninterrupted run would.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch.profiler import record_function

from draftsmith.draft.checkpoint import nonfinite, save_drafter
from draftsmith.errors import UserError
from draftsmith.progress import Progress
from draftsmith.train import checkpointing as ckpt
from draftsmith.train.batching import OfflineSource, OnlineSource, collate, pack_rows, shard_rows, to_device
from draftsmith.train.config import TrainConfig
from draftsmith.train.metrics import MetricsLog, add_stats, summarise, zero_stats
from draftsmith.train.optim import Optimizers

if TYPE_CHECKING:
    from draftsmith.train.objectives import Objective


def all_reduce_stats(stats: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    """Sum metric counts over ranks (no-op on one process)."""
    if not (dist.is_available() and dist.is_initialized()):
        return stats
    keys = sorted(stats)
    flat = torch.stack([stats[k] for k in keys]).to(device)  # [n_keys, K]
    dist.all_reduce(flat)
    return {k: flat[i].cpu().double() for i, k in enumerate(keys)}


@dataclass
class Position:
    """What a checkpoint must remember besides weights and optimizer."""

    step: int = 0
    epoch: int = 0
    row: int = 0  # next row of this epoch (per rank)
    tokens: int = 0
    best_tau: float = -1.0
    pending: dict[str, list[float]] = field(default_factory=dict)  # metric counts since the last log


@dataclass
class Env:
    rank: int = 0
    world: int = 1
    device: torch.device = torch.device("cpu")
    fsdp: bool = False

    @property
    def main(self) -> bool:
        return self.rank == 0


@dataclass
class TrainData:
    """The samples to train on: a source (store or online capture) and its train / validation split."""

    source: OnlineSource | OfflineSource
    train_idx: list[int]
    val_idx: list[int]


def wrap(objective: Objective, env: Env) -> torch.nn.Module:
    """The objective as this process trains it: itself on one process, else under DDP or FSDP2."""
    if env.world == 1:
        return objective
    if env.fsdp:
        from torch.distributed.fsdp import fully_shard

        for layer in objective.drafter.decoder_layers:
            fully_shard(layer)
        return fully_shard(objective)
    from torch.nn.parallel import DistributedDataParallel

    ids = [env.device.index] if env.device.type == "cuda" else None
    return DistributedDataParallel(objective, device_ids=ids, broadcast_buffers=False)


class Trainer:
    def __init__(
        self,
        cfg: TrainConfig,
        env: Env,
        objective: Objective,
        data: TrainData,
        log: MetricsLog,
        drafter_meta: dict[str, Any],
    ) -> None:
        self.cfg, self.env, self.objective, self.wrapped = cfg, env, objective, wrap(objective, env)
        self.source, self.train_idx, self.val_idx = data.source, data.train_idx, data.val_idx
        self.log, self.out, self.meta = log, Path(cfg.out), drafter_meta
        # static shapes for compiled flex and the static (compiled) step
        self.pad_to = cfg.batch_tokens if objective.static_shapes else None
        rows0 = len(self.epoch_rows(0))
        self.steps_per_epoch = max(rows0 // cfg.grad_accum, 1)
        self.total = cfg.steps or max(math.ceil(cfg.epochs * rows0 / cfg.grad_accum), 1)
        self.optim = Optimizers(
            self.wrapped,
            cfg.optimizer,
            cfg.lr,
            cfg.weight_decay,
            cfg.schedule,
            self.total,
            int(cfg.warmup_ratio * self.total),
        )
        self.pos = Position()
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="prefetch")
        self._ahead: dict[tuple[int, ...], Future] = {}
        self._data_wait = 0.0  # seconds the loop spent getting training rows since the last log
        self.autocast = torch.autocast(env.device.type, dtype=torch.bfloat16, enabled=bool(cfg.autocast))
        # The compiled static step validates with gradients on (and no backward): under no_grad
        # dynamo would compile a second, inference-only graph (experiments/LOG.md 2026-12-03 06:28).
        # Multi-process runs validate the plain way: DDP and FSDP2 make ready for a backward after
        # each forward with gradients on.
        self.validate_with_grad = objective.compiled_on(env.device) and env.world == 1

    # -- data ------------------------------------------------------------------------------
    def epoch_rows(self, epoch: int) -> list[list[int]]:
        rows = pack_rows(self.source.lengths, self.train_idx, self.cfg.batch_tokens, seed=self.cfg.seed + epoch)
        return shard_rows(rows, self.env.rank, self.env.world)

    def prefetch(self, rows: list[list[int]]) -> None:
        """Start reading the next rows in a background thread (offline sources only: online
        capture shares the GPU with training, so overlapping it gains nothing)."""
        if getattr(self.source, "prefetch", False):
            for row in rows:
                if tuple(row) not in self._ahead:
                    self._ahead[tuple(row)] = self._pool.submit(self.host_row, row)

    def host_row(self, row: list[int]) -> dict[str, torch.Tensor]:
        """A row's samples read and laid end to end (pinned when training on a GPU)."""
        return collate(self.source.samples(row), self.pad_to, pin=self.env.device.type == "cuda")

    def batch(self, row: list[int]) -> dict[str, torch.Tensor]:
        ahead = self._ahead.pop(tuple(row), None)
        return to_device(ahead.result() if ahead is not None else self.host_row(row), self.env.device)

    # -- steps -----------------------------------------------------------------------------
    def optimizer_step(self, rows: list[list[int]]) -> tuple[dict[str, torch.Tensor], int]:
        """One optimizer step over `rows` (the accumulation group). Returns counts and tokens."""
        self.wrapped.train()
        device_stats: list[dict[str, torch.Tensor]] = []  # summed and read once, after the step's one sync
        tokens = 0
        for i, row in enumerate(rows):
            t0 = time.perf_counter()
            with record_function("train.data"):  # the phases as torch.profiler names them (bench/train_bench.py)
                batch = self.batch(row)
            self._data_wait += time.perf_counter() - t0  # training rows only, not validation's
            tokens += int(self.source.lengths[row].sum())  # the row's (truncated) samples, from the host: no sync
            last = i == len(rows) - 1
            sync = contextlib.nullcontext() if last or not hasattr(self.wrapped, "no_sync") else self.wrapped.no_sync()
            with sync, self.autocast:
                with record_function("train.forward"):
                    loss, st = self.wrapped(**batch)
                with record_function("train.backward"):
                    (loss / len(rows)).backward()
            device_stats.append({k: v.detach() for k, v in st.items()})
        with record_function("train.optimizer"):
            norm = torch.nn.utils.clip_grad_norm_(
                [p for p in self.wrapped.parameters() if p.requires_grad], self.cfg.grad_clip
            )
            if not torch.isfinite(
                norm
            ):  # one host sync per step; a NaN/Inf anywhere in loss, data or weights lands here
                raise self.diverged(f"step {self.pos.step + 1}: the gradient norm is {float(norm)}", rows)
            stats = zero_stats(self.cfg.depth)
            for st in device_stats:  # read while the device is idle after that sync, before the update is queued
                add_stats(stats, st)
            self.optim.step()
            self.optim.zero_grad()
        return stats, tokens

    @torch.no_grad()
    def validate(self) -> dict[str, Any]:
        """Metrics over the validation split (the training samples when none is held out)."""
        self.wrapped.eval()
        indices = self.val_idx or self.train_idx
        rows = pack_rows(self.source.lengths, indices, self.cfg.batch_tokens, seed=None)
        mine = rows[self.env.rank :: self.env.world]
        per_rank = -(-len(rows) // self.env.world)  # every rank runs as many forwards (FSDP gathers in each)
        stats = zero_stats(self.cfg.depth)
        for i in range(per_rank):
            batch = self.batch(mine[i] if i < len(mine) else rows[0])  # captured as training's rows are: outside both
            with self.autocast, torch.set_grad_enabled(self.validate_with_grad):
                st = self.wrapped(**batch)[1]  # the loss (and its graph) goes at once
            if i < len(mine):  # a padding forward's counts are not kept
                add_stats(stats, st)
        record = {
            "split": "val",
            "step": self.pos.step,
            "epoch": self.pos.epoch,
            **summarise(all_reduce_stats(stats, self.env.device), self.objective.reached_only, self.objective.loss),
        }
        if not math.isfinite(record["loss"]):  # (the same on every rank: all-reduced) nothing is published from it
            raise self.diverged(f"validation at step {self.pos.step}: the loss is {record['loss']}", mine)
        self.log.write(record)
        if self.env.main:
            walked = (
                f", walked τ {record['tau_walk']:.3f} (what eval measures on this distribution)"
                if "tau_walk" in record
                else ""
            )
            print(
                f"[train] validation at step {record['step']}: acc_0 {record['acc_0']:.4f}, simulated τ {record['tau']:.3f}"
                f"{walked}",
                flush=True,
            )
        if record["tau"] > self.pos.best_tau:
            self.pos.best_tau = record["tau"]
            self.save_best(record)
        return record

    # -- non-finite values ------------------------------------------------------------------
    def local_weights(self) -> dict[str, torch.Tensor]:
        """The drafter's parameters as this rank holds them (its shards under FSDP2)."""
        return {
            n: getattr(p, "to_local", lambda p=p: p)().detach() for n, p in self.objective.drafter.named_parameters()
        }

    def diverged(self, what: str, rows: list[list[int]]) -> UserError:
        """The error that stops a run where `what` went NaN or Inf, with its likely cause: the data of
        `rows` (the rows it was computed on) when it holds a NaN or Inf, else the learning rate (the
        last update made the weights non-finite, or so large that the drafter's own arithmetic
        overflows). Runs only on this failure path: it reads `rows` again."""
        kept = "nothing from it was saved: the last saved drafter and checkpoints are untouched"
        bad = nonfinite(self.local_weights())
        data_bad = not bad and any(
            t.is_floating_point() and not bool(torch.isfinite(t).all())
            for row in rows
            for t in self.host_row(row).values()
        )
        if data_bad:
            return UserError(
                f"{what}: the data of rows {[r[:4] for r in rows]} holds a NaN or Inf; {kept}: check the "
                "data (an extract store made with NaNs? extract it again)"
            )
        if not self.pos.step:  # no update has run: not the learning rate
            where = f"the drafter's initial weights {', '.join(bad[:3])}" if bad else "finite data and weights"
            return UserError(
                f"{what} before any update, from {where}: the target's embeddings, head or hidden states "
                f"overflow the drafter; check the target (`draftsmith extract` refuses NaN or Inf); {kept}"
            )
        made = (
            f"made the drafter's weights NaN or Inf ({', '.join(bad[:3])})"
            if bad
            else "left the drafter's weights so large that its own arithmetic overflows (its input data is finite)"
        )
        return UserError(
            f"{what}: the update of step {self.pos.step} {made}: the learning rate --lr {self.cfg.lr:g} is too "
            f"high for this run; lower --lr (or raise --warmup-ratio) and train again; {kept}"
        )

    def check_weights(self, what: str) -> None:
        """Before a save: the weights are finite (one pass over them, at each save only)."""
        if nonfinite(self.local_weights()):
            raise self.diverged(what, [])

    # -- saving ----------------------------------------------------------------------------
    def save_best(self, record: dict[str, Any]) -> None:
        self.check_weights(f"publishing the drafter of step {self.pos.step}")
        state = ckpt.drafter_state(self.objective, self.env.fsdp)
        if not self.env.main:
            return
        model = type(self.objective.drafter)(self.objective.drafter.config)
        model.load_state_dict(state)
        meta = {
            **self.meta,
            "simulated_tau": record["tau"],
            "step": record["step"],
            "epoch": record["epoch"],
            "val": {
                k: record[k] for k in ("loss", "acc_k", "cond_acc_k", "tau", "walk_accept_k", "tau_walk") if k in record
            },
        }
        tmp, final = self.out / ".drafter.tmp", self.out / "drafter"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            save_drafter(model, tmp, target=self.meta.get("target"), meta=meta)
        except BaseException:  # a full disk: no partial drafter is left behind; the published one is kept
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        old = self.out / ".drafter.old"
        if final.exists():
            os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)

    def save_checkpoint(self) -> None:
        self.check_weights(f"saving the checkpoint of step {self.pos.step}")
        weights = ckpt.drafter_state(self.objective, self.env.fsdp)
        optim = ckpt.optimizer_state(self.objective, self.optim.optimizers, self.env.fsdp)
        if self.env.main:
            state = {
                "optimizer": optim,
                "scheduler": self.optim.scheduler_state(),
                "rng": ckpt.rng_state(),
                "train": asdict(self.pos),
                "target": self.meta["target"]["fingerprint"],  # the teacher's weights: a resume checks them
            }
            frozen = ckpt.frozen_keys(self.objective.drafter)
            ckpt.save_checkpoint(self.out, self.pos.step, weights, state, self.cfg.keep_checkpoints, frozen)
        if dist.is_available() and dist.is_initialized():
            dist.barrier()

    def resume(self, weights: dict[str, torch.Tensor], state: dict[str, Any]) -> None:
        """Continue from a checkpoint that `ckpt.resume_checkpoint` read and checked."""
        drafter = self.objective.drafter
        if self.env.fsdp:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

            full = {f"drafter.{k}": v for k, v in weights.items()}
            set_model_state_dict(self.objective, full, options=StateDictOptions(full_state_dict=True, strict=False))
        else:
            missing, unexpected = drafter.load_state_dict(weights, strict=False)
            assert not unexpected and set(missing) <= ckpt.frozen_keys(drafter), (missing, unexpected)
        ckpt.load_optimizer_state(self.objective, self.optim.optimizers, state["optimizer"], self.env.fsdp)
        self.optim.load_scheduler_state(state["scheduler"])
        ckpt.set_rng_state(state["rng"])
        self.pos = Position(**state["train"])

    # -- the loop --------------------------------------------------------------------------
    def run(self, progress: Progress | None) -> dict[str, Any] | None:
        cfg = self.cfg
        if self.pos.step >= self.total:  # resuming a finished run
            return None
        pending = zero_stats(cfg.depth)
        if self.pos.pending and self.env.main:  # saved summed over ranks: rank 0 carries them
            pending.update({k: torch.tensor(v, dtype=torch.float64) for k, v in self.pos.pending.items()})
        last_val = None
        if self.env.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()  # (the current device) this run's peak, not an earlier stage's
        t_log, tokens_log, self._data_wait = time.time(), self.pos.tokens, 0.0
        rows = self.epoch_rows(self.pos.epoch)
        while self.pos.step < self.total:
            group = rows[self.pos.row : self.pos.row + cfg.grad_accum]
            self.prefetch(rows[self.pos.row + cfg.grad_accum : self.pos.row + 2 * cfg.grad_accum])
            stats, tokens = self.optimizer_step(group)
            self.pos.row += len(group)
            self.pos.step += 1
            self.pos.tokens += tokens * self.env.world
            add_stats(pending, stats)
            if self.pos.step % cfg.log_every == 0 or self.pos.step == self.total:
                now = time.time()
                rec = {
                    "split": "train",
                    "step": self.pos.step,
                    "epoch": self.pos.epoch,
                    "tokens": self.pos.tokens,
                    "lr": self.optim.lr,
                    # since the last train record (a validation between them included): the first
                    # record's counts the compilation, the later ones the steady rate
                    "tok_per_s": (self.pos.tokens - tokens_log) / max(now - t_log, 1e-9),
                    **summarise(
                        all_reduce_stats(pending, self.env.device), self.objective.reached_only, self.objective.loss
                    ),
                }
                self.log.write(rec)
                pending = zero_stats(cfg.depth)
                if progress is not None:
                    # data_wait: the share of the time since the last log spent reading and collating rows
                    # (for online training, the target's capture forward)
                    progress.set(
                        loss=round(rec["loss"], 4),
                        **{k: round(rec[k], 4) for k in (self.objective.loss,) if k in rec},  # --loss tv / lk
                        acc_0=round(rec["acc_0"], 4),
                        tau=round(rec["tau"], 3),
                        data_wait=round(self._data_wait / max(now - t_log, 1e-9), 3),
                        **self.memory(),
                    )
                t_log, tokens_log, self._data_wait = now, self.pos.tokens, 0.0
            if progress is not None:
                progress.advance(1, tokens=tokens * self.env.world)
            if self.pos.row + cfg.grad_accum > len(rows):  # epoch done (a short tail group is dropped)
                self.pos.epoch += 1
                self.pos.row = 0
                rows = self.epoch_rows(self.pos.epoch)
                if cfg.val_every is None:
                    last_val = self.validate()
            if cfg.val_every is not None and self.pos.step % cfg.val_every == 0:
                last_val = self.validate()
            if self.pos.step % cfg.save_every == 0 and self.pos.step < self.total:
                self.pos.pending = {k: v.tolist() for k, v in all_reduce_stats(dict(pending), self.env.device).items()}
                self.save_checkpoint()
        if last_val is None or last_val["step"] != self.pos.step:
            last_val = self.validate()
        self.pos.pending = {}
        self.save_checkpoint()
        return last_val

    def memory(self) -> dict[str, float]:
        if self.env.device.type != "cuda":
            return {}
        stats = torch.cuda.memory_stats()  # the current device: this rank's
        out = {
            "gpu_mem_gb": round(stats.get("allocated_bytes.all.peak", 0) / 1e9, 2),
            "gpu_reserved_gb": round(stats.get("reserved_bytes.all.current", 0) / 1e9, 2),
        }
        if stats.get("num_alloc_retries", 0):  # the caching allocator ran out and freed its cache: slow steps
            out["alloc_retries"] = int(stats["num_alloc_retries"])
        return out
