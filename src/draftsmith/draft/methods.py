"""The drafter methods: one `Method` record each, the one place that says what a method is.

    name         the one value of `train --method`, drafter.json's and report.json's `method`
    config       its config class (`DrafterConfig`, `DFlashConfig`); its `method` field is the name
    module       its drafter module (`Eagle3Drafter`, `DFlashDrafter`)
    one_forward  one drafter forward drafts the whole cycle (no draft reads another's output)
    trees        it drafts EAGLE-2 trees as well as chains
    engines      the serving engines that serve it (export refuses the others)
    depth_limit  the most drafts per cycle a drafter of a given config makes (None: no limit)
    aux_count    how many target layers it reads (EAGLE-3's fc is 3 x hidden in every engine; None: any)

Each stage keeps one table keyed by the name, holding its part of a method: train's
`OBJECTIVES`, evaluate's `PROPOSERS`, export's `WRITERS`. A stage asks the record, or looks the
name up in its table; it never tests which method it holds. Adding a method:
docs/adding-a-method.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from draftsmith.draft.dflash import DFlashConfig, DFlashDrafter
from draftsmith.draft.dflash_layout import import_dflash, is_dflash_folder
from draftsmith.draft.model import DrafterConfig, Eagle3Drafter
from draftsmith.errors import UserError
from draftsmith.layers import N_AUX


def no_limit(cfg: Any) -> int | None:
    """A drafter that drafts as deep as it is asked (one step per draft, or one slot per draft)."""
    return None


def block_limit(cfg: DFlashConfig) -> int:
    """A block drafter drafts at most its mask slots."""
    return cfg.drafts


def never(path: Path) -> bool:
    return False


@dataclass(frozen=True)
class Method:
    name: str
    title: str  # its name in prose: "EAGLE-3"
    drafting: str  # how it drafts, in a few words, for messages: "parallel drafting"
    config: type
    module: type
    one_forward: bool
    trees: bool
    engines: tuple[str, ...]
    depth_limit: Callable[[Any], int | None] = no_limit
    aux_count: int | None = N_AUX
    unserved: str = ""  # why the engines left out of `engines` do not serve it, for export's refusal
    # whether an engine-layout folder (config.json) is in this method's own layout, read by
    # `read_folder`; the EAGLE-3 layouts' reader (draft/importer.py) reads every other one
    claims_folder: Callable[[Path], bool] = never
    read_folder: Callable[[Path], tuple[torch.nn.Module, dict[str, Any]]] | None = None

    def build(self, config: dict[str, Any]) -> torch.nn.Module:
        """A fresh drafter module of this method from drafter.json's `config`."""
        return self.module(self.config.from_dict(config))


EAGLE3 = Method(
    "eagle3", "EAGLE-3", "one forward per draft", DrafterConfig, Eagle3Drafter, False, True, ("vllm", "sglang")
)
PEAGLE = Method(
    "peagle",
    "P-EAGLE",
    "parallel drafting",
    DrafterConfig,
    Eagle3Drafter,
    True,
    False,
    ("vllm",),
    unserved="SGLang has no parallel-drafting EAGLE; vLLM runs it as llama_eagle3 with speculative_config "
    "parallel_drafting=True",
)
DFLASH = Method(
    "dflash",
    "DFlash",
    "block drafting",
    DFlashConfig,
    DFlashDrafter,
    True,
    False,
    ("vllm",),
    block_limit,
    aux_count=None,
    unserved="vLLM's qwen3_dflash reads draftsmith's layout, lm_head and d2t included; SGLang's DFlashDraftModel "
    "has no lm_head or d2t of its own: it drafts through the target's full-vocab head, so it would drop this "
    "drafter's trained draft-vocab head",
    claims_folder=is_dflash_folder,
    read_folder=import_dflash,
)
METHODS: dict[str, Method] = {m.name: m for m in (EAGLE3, PEAGLE, DFLASH)}
NAMES = tuple(METHODS)


def method_named(name: str, where: str = "drafter") -> Method:
    """The record of `name`; a UserError naming the methods draftsmith knows otherwise."""
    if name not in METHODS:
        raise UserError(f"{where}: method {name!r} is not one draftsmith knows ({', '.join(NAMES)})")
    return METHODS[name]


def method_of(drafter: Any) -> Method:
    """The record of a drafter module or config (their `method` field)."""
    return METHODS[getattr(drafter, "config", drafter).method]


def record_method(record: dict[str, Any]) -> str:
    """The method a drafter.json records: its config's `method` (a P-EAGLE record written before
    the top-level `method` named it said "eagle3" there), else the top-level one, else EAGLE-3's
    (a record older than both)."""
    return str((record.get("config") or {}).get("method") or record.get("method") or EAGLE3.name)


def serving_refusal(cfg: Any, engine: str) -> str | None:
    """Why `engine` cannot serve a drafter of this config's method, naming the engines that can;
    None when it can."""
    m = method_of(cfg)
    if engine in m.engines:
        return None
    why = f" ({m.unserved})" if m.unserved else ""
    return (
        f"this is a {m.title} drafter ({m.drafting}), which {engine} does not serve{why}; it is served by "
        f"{', '.join(m.engines)}: export with --engine {m.engines[0]}"
    )


def trained_depth(record: dict[str, Any]) -> int | None:
    """The draft depth a drafter was trained for (`train --depth`: TTT's unroll, P-EAGLE's slots,
    DFlash's block), from its record's meta; None where the record does not say (a third-party
    drafter, or one saved by hand)."""
    meta = record.get("meta") or {}
    depth = meta.get("depth", meta.get("ttt"))  # "ttt": a record written before the option was named --depth
    return depth if isinstance(depth, int) and not isinstance(depth, bool) and depth > 0 else None


def deepest(cfg: Any, trained: int | None) -> int | None:
    """The deepest draft a drafter of this config may make: its method's limit (`depth_limit`) and
    the depth it was trained for, whichever is lower; None when neither bounds it."""
    bounds = [d for d in (method_of(cfg).depth_limit(cfg), trained) if d is not None]
    return min(bounds) if bounds else None


def check_depth(cfg: Any, depth: int, flag: str = "--depth", trained: int | None = None) -> None:
    """Refuse a draft deeper than the drafter's method drafts (`depth_limit`), or than it was
    trained for (`trained`: drafts past the trained depth are positions it never learnt)."""
    m = method_of(cfg)
    most = m.depth_limit(cfg)
    if most is not None and depth > most:
        raise UserError(
            f"{flag} {depth}: this {m.title} drafter ({m.drafting}) drafts at most {most} per cycle; "
            f"use {flag} {most} or less"
        )
    if trained is not None and depth > trained:
        raise UserError(
            f"{flag} {depth}: this {m.title} drafter was trained to draft {trained} deep (train --depth {trained}), "
            f"and drafts past that are positions it never learnt; use {flag} {trained} or less, or train a drafter "
            f"with --depth {depth}"
        )
