"""Training checkpoints: everything a resumed run needs to continue the same curve.

    OUT/checkpoints/step_{N:08d}/
        model.safetensors   the drafter's trainable weights and buffers (not the frozen
                            embeddings, which come from the target again; with
                            --train-embedding, the trained ones)
        state.pt            {"optimizer", "scheduler", "rng", "train"} as plain tensors, numbers,
                            lists and dicts: read back with torch.load(weights_only=True)

A checkpoint folder is written under a temporary name and renamed into place, so a kill at any
instant leaves only complete checkpoints; the newest `keep` are kept. Under FSDP2 the full
(unsharded) model and optimizer states are gathered with torch.distributed.checkpoint's
state-dict helpers; under DDP or on one device, rank 0's plain state dicts are used.
"""

from __future__ import annotations

import os
import random
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from draftsmith.draft.checkpoint import save_file
from draftsmith.errors import UserError, naming
from draftsmith.fsutil import fsync_dir, read_safetensors
from draftsmith.target import same_target

CKPT_DIR, WEIGHTS, STATE = "checkpoints", "model.safetensors", "state.pt"
FROZEN = ("embed_tokens.weight",)  # the target's own while they do not train: left out of checkpoints


def frozen_keys(drafter: nn.Module) -> set[str]:
    """The `FROZEN` weights that do not train in this run (with --train-embedding the embedding
    trains, and is checkpointed like the rest)."""
    params = dict(drafter.named_parameters())
    return {k for k in FROZEN if k in params and not params[k].requires_grad}


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": list(random.getstate()[1])}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate((3, tuple(state["python"]), None))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def drafter_state(objective: nn.Module, fsdp: bool) -> dict[str, torch.Tensor]:
    """The drafter's full state dict on CPU (draftsmith key names), from any wrapping."""
    if fsdp:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        full = get_model_state_dict(objective, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    else:
        full = objective.state_dict()
    return {k.split("drafter.", 1)[1]: v.detach().cpu() for k, v in full.items() if "drafter." in k}


def optimizer_state(objective: nn.Module, optimizers: list[torch.optim.Optimizer], fsdp: bool) -> Any:
    """The optimizers' states: under FSDP2 one merged full state dict, else one state dict each."""
    if fsdp:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        return get_optimizer_state_dict(
            objective, optimizers, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
        )
    return [o.state_dict() for o in optimizers]


def load_optimizer_state(objective: nn.Module, optimizers: list[torch.optim.Optimizer], state: Any, fsdp: bool) -> None:
    if fsdp:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        set_optimizer_state_dict(
            objective, optimizers, state, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=False)
        )
    else:
        if not isinstance(state, list) or len(state) != len(optimizers):
            raise UserError(
                "this checkpoint's optimizer state is not the run's (one state per optimizer: a checkpoint "
                "of an older draftsmith, or of another --optimizer); start a new run or keep the old options"
            )
        for opt, st in zip(optimizers, state, strict=True):
            opt.load_state_dict(st)


def save_checkpoint(
    out: Path, step: int, weights: dict[str, torch.Tensor], state: dict[str, Any], keep: int, frozen: set[str]
) -> Path:
    """Write one checkpoint atomically, without the `frozen` weights (`frozen_keys`), and prune
    older ones beyond `keep`."""
    root = Path(out) / CKPT_DIR
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step:08d}"
    tmp = root / f".step_{step:08d}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        save_file({k: v.contiguous() for k, v in weights.items() if k not in frozen}, tmp / WEIGHTS)
        save_state(state, tmp / STATE)
        with open(tmp / WEIGHTS, "rb") as fh:
            os.fsync(fh.fileno())
    except BaseException:  # a full disk, a file-size limit: no partial checkpoint is left behind
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    fsync_dir(root)
    for old in sorted(root.glob("step_*"))[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def complete_checkpoints(out: Path) -> list[Path]:
    """The checkpoint folders of run `out` that hold both files, oldest first."""
    return [p for p in sorted((Path(out) / CKPT_DIR).glob("step_*")) if (p / STATE).exists() and (p / WEIGHTS).exists()]


def save_state(state: dict[str, Any], path: Path) -> None:
    """torch.save into a file of our own, fsynced: a write the OS refuses (a full disk) is raised as
    the OSError it is, naming `path` (torch's writer turns it into a RuntimeError)."""
    try:
        with open(path, "wb") as f:
            try:
                torch.save(state, f)
            except RuntimeError as e:
                if isinstance(e.__context__, OSError):
                    raise e.__context__ from None
                raise
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        raise naming(e, path) from None


def latest_checkpoint(out: Path) -> Path | None:
    done = complete_checkpoints(out)
    return done[-1] if done else None


class UnreadableCheckpoint(UserError):
    """A checkpoint whose files do not read back (as opposed to one made with other options)."""


def read_checkpoint(folder: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """A checkpoint's weights and state as saved, or an UnreadableCheckpoint naming the file that
    does not read back (truncated, corrupt)."""
    try:
        weights = read_safetensors(folder / WEIGHTS, "passed over")
    except UserError as e:
        raise UnreadableCheckpoint(str(e)) from None
    try:
        state = torch.load(folder / STATE, weights_only=True)
    except Exception as e:
        raise UnreadableCheckpoint(f"{folder / STATE}: unreadable ({e}); passed over") from None
    return weights, state


def resume_checkpoint(
    out: Path, drafter: nn.Module, fingerprint: str, say: Callable[[str], None]
) -> tuple[dict[str, torch.Tensor], dict[str, Any]] | None:
    """The weights and state of the newest complete checkpoint of run `out` that reads back, checked
    against the run's `drafter` (every tensor's name and shape: a UserError when it was made with
    other options) and its target's `fingerprint` (a UserError when the checkpoint was trained
    against other weights, such as a fine-tune saved over the target; checkpoints before
    2026-12-04 recorded none). A newer one that does not read back (torn by a copy, a failing
    disk) is passed over with one line through `say`. None when the run has no checkpoint; a
    UserError when none reads back."""
    found = complete_checkpoints(out)
    for folder in reversed(found):
        try:
            weights, state = read_checkpoint(folder)
        except UnreadableCheckpoint as e:
            say(f"[train] --resume: {e}: resuming from the checkpoint before it")
            continue
        frozen = frozen_keys(drafter)
        expected = {k: tuple(v.shape) for k, v in drafter.state_dict().items() if k not in frozen}
        got = {k: tuple(v.shape) for k, v in weights.items()}
        differ = sorted(k for k in expected.keys() | got.keys() if expected.get(k) != got.get(k))
        if differ:
            raise UserError(
                f"checkpoint {folder} was made with other options than this run ({', '.join(differ[:4])} "
                f"differ); resume with the options in {Path(out) / 'run.yaml'}, or start over with --overwrite"
            )
        made_for = state.get("target")
        if made_for is not None and not same_target(made_for, fingerprint):
            raise UserError(
                f"checkpoint {folder} was trained against a target of other weights (fingerprint {made_for}, "
                f"this run's {fingerprint}: a fine-tune saved over it?); resume with the target it started with, "
                "or start over with --overwrite"
            )
        return weights, state
    if found:
        raise UserError(
            f"--resume: no checkpoint in {Path(out) / CKPT_DIR} reads back ({', '.join(p.name for p in found)}); "
            "start over with --overwrite, or train into another --out"
        )
    return None
