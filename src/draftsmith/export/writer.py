"""What a layout's writer gives `export.run` (export/run.py's `WRITERS`: one per method and format)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from draftsmith.export.config import ExportConfig


@dataclass
class Files:
    """What an export writes besides its run.yaml: config.json, model.safetensors and README.md;
    `layout` and `layers` describe them on its log line."""

    config: dict[str, Any]
    tensors: dict[str, torch.Tensor]
    card: str
    layout: str
    layers: str


@dataclass(frozen=True)
class Writer:
    """One layout's writer: `files` checks the drafter (refusing, before anything is written, what
    an engine would load without error but serve wrongly) and builds the folder's files from the
    drafter, its record and the weights' dtype; `reload_check` reads the written folder back and
    compares its logits."""

    files: Callable[[Any, dict[str, Any], ExportConfig, torch.dtype], Files]
    reload_check: Callable[[Any, Path, torch.dtype], None]
