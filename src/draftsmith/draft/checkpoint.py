"""The drafter folder that `train` writes and `eval` / `export` read.

    drafter.json        {"format": "draftsmith-drafter", "version": 1, "method": a METHODS name,
                         "config": its config (with the same `method`), "target": TargetInfo dict,
                         "meta": {...}} (a record without "method" is an EAGLE-3 drafter; an older
                         P-EAGLE one says "eagle3" at the top and "peagle" in its config: read as P-EAGLE)
    model.safetensors   draftsmith key names: embed_tokens.weight, fc.weight, midlayer.*,
                         norm.weight, lm_head.weight, d2t, t2d

`load_drafter` also accepts exported or third-party EAGLE-3 folders (a `config.json`), which
`draftsmith.draft.importer` converts.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import torch

from draftsmith.draft.importer import import_drafter
from draftsmith.draft.methods import METHODS, method_named, method_of, record_method
from draftsmith.errors import UserError
from draftsmith.fsutil import _umask, atomic_write_json, check_built_size, read_safetensors

DRAFTER_FILE, WEIGHTS, FORMAT = "drafter.json", "model.safetensors", "draftsmith-drafter"


def save_file(tensors: dict[str, torch.Tensor], path: Path | str, metadata: dict[str, str] | None = None) -> None:
    """safetensors' `save_file`, the one way draftsmith writes a safetensors file of tensors (a
    drafter, a checkpoint, an export): a write the OS refused (a full disk, the file-size limit)
    is raised as the OSError it is, naming `path` (safetensors raises a SafetensorError that says
    only "... (os error 28)", and leaves no file), and the file gets the umask's normal mode
    (safetensors makes it 0600)."""
    from safetensors import SafetensorError
    from safetensors.torch import save_file as write

    try:
        write(tensors, str(path), metadata=metadata)
    except SafetensorError as e:
        code = re.search(r"os error (\d+)", str(e))
        if code is None:
            raise
        raise OSError(int(code[1]), os.strerror(int(code[1])), str(path)) from None
    os.chmod(path, 0o666 & ~_umask())


def save_drafter(
    model: torch.nn.Module,
    folder: Path,
    target: dict[str, Any] | None = None,
    meta: dict[str, Any] | None = None,
) -> Path:
    """Write weights first, then drafter.json (a folder with a drafter.json is complete)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    tmp = folder / (WEIGHTS + ".tmp")
    save_file(state, tmp)
    tmp.replace(folder / WEIGHTS)
    atomic_write_json(
        folder / DRAFTER_FILE,
        {
            "format": FORMAT,
            "version": 1,
            "method": method_of(model).name,
            "config": model.config.to_dict(),
            "target": target or {},
            "meta": meta or {},
        },
    )
    return folder


FIX = "train it again, or copy the folder again from where it was made"


def read_drafter_record(folder: Path) -> dict[str, Any]:
    """drafter.json, checked to be a draftsmith drafter record with a config; a UserError names it."""
    path = Path(folder) / DRAFTER_FILE
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:  # not JSON, or not UTF-8
        raise UserError(f"{path}: corrupt ({e}); {FIX}") from None
    if not isinstance(record, dict) or record.get("format") != FORMAT or not isinstance(record.get("config"), dict):
        raise UserError(f"{path}: not a draftsmith drafter record (needs format {FORMAT!r} and a config); {FIX}")
    return record


def load_drafter(
    path: Path, device: str | torch.device = "cpu", convention: str | None = None
) -> tuple[Any, dict[str, Any]]:
    """Load a drafter folder (native, exported, or third-party EAGLE-3; `convention`: the layer-id
    convention of a third-party folder's config, as `import_drafter` takes it). Returns the model
    and its record (drafter.json's `config`, `target`, `meta`). A drafter with a NaN or Inf weight
    is refused (`check_finite`): eval and export take no diverged drafter."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"drafter {path}: no such folder")
    if (path / "drafter" / DRAFTER_FILE).exists():  # a `draftsmith train` output folder: its best drafter
        path = path / "drafter"
    if (path / DRAFTER_FILE).exists():
        record = read_drafter_record(path)
        method = method_named(record_method(record), str(path / DRAFTER_FILE))
        build = lambda: method.build({**record["config"], "method": method.name})  # noqa: E731
        check_built_size(build, path / WEIGHTS, str(path / DRAFTER_FILE), FIX)  # before it allocates
        try:
            model = method.build({**record["config"], "method": method.name})
        except (TypeError, ValueError, RuntimeError) as e:  # a missing or mistyped field
            raise UserError(f"{path / DRAFTER_FILE}: its config does not describe a drafter ({e}); {FIX}") from None
        state = read_safetensors(path / WEIGHTS, FIX)
        try:
            missing, unexpected = model.load_state_dict(state, strict=False)
        except RuntimeError as e:  # a tensor of the wrong shape
            raise UserError(f"drafter {path}: weights do not match its config ({e}); {FIX}") from None
        if missing or unexpected:
            raise UserError(
                f"drafter {path}: weights do not match its config (missing {missing}, unexpected {unexpected}); {FIX}"
            )
    elif (path / "config.json").exists():  # an engine's layout: a method's own, else an EAGLE-3 one
        own = next((m for m in METHODS.values() if m.claims_folder(path)), None)
        if own is not None and own.read_folder is not None:
            model, record = own.read_folder(path)
        else:
            model, record = import_drafter(path, convention=convention)
    elif (path / "state.pt").exists():  # train's OUT/checkpoints/step_N: weights and optimizer, no drafter record
        raise UserError(
            f"{path} is a training checkpoint (what `train --resume` continues from), not a drafter folder: give "
            f"the training run's folder (its drafter/, the best by validation τ so far) or an exported folder"
        )
    else:
        raise UserError(f"{path} is not a drafter folder (no {DRAFTER_FILE} or config.json)")
    check_finite(model.state_dict(), f"drafter {path}")
    return model.to(device).eval(), record


def nonfinite(state: dict[str, torch.Tensor]) -> list[str]:
    """The names of the floating-point tensors of `state` that hold a NaN or Inf."""
    return [name for name, t in state.items() if t.is_floating_point() and not bool(torch.isfinite(t).all())]


def check_finite(state: dict[str, torch.Tensor], where: str) -> None:
    """A UserError naming the NaN or Inf weights of a drafter (`where`: its folder), which can be
    neither measured nor served."""
    bad = nonfinite(state)
    if bad:
        raise UserError(
            f"{where}: NaN or Inf weights in {', '.join(bad[:5])}; this drafter cannot be evaluated or "
            "served. Use an earlier drafter or checkpoint, or retrain it (a training run that diverged: "
            "lower --lr)"
        )
