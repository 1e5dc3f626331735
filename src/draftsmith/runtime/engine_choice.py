"""Which engine decodes a target: draftsmith's fast static-KV engine (engine.py) when it passes
the self-check (selfcheck.py), else the generic Hugging Face path (generic.py), announced.

`open_engine` builds the engine `eval` decodes with: the fast one, or `HFEngine` after one log
line naming the model class and the reason; `Engine` is either. (`synth` asks the self-check's
verdict alone, `fast_engine_problem`, and then generates with the model's own `generate`.)
"""

from __future__ import annotations

import sys

from torch import nn

from draftsmith.errors import UserError
from draftsmith.runtime.engine import TargetEngine
from draftsmith.runtime.generic import HFEngine
from draftsmith.runtime.selfcheck import fast_engine_problem, generic_tree_problem

Engine = TargetEngine | HFEngine


def open_engine(
    model: nn.Module,
    aux_layer_ids: list[int],
    max_len: int,
    mode: str = "chain",
    batch: int = 1,
    compile: bool = False,
    fuse: bool | None = None,
) -> Engine:
    """The engine `eval` decodes with: the fast engine (of `batch` rows; its graphed forwards
    compiled with `compile`, its projections fused with `fuse`: `TargetEngine`) when it passes
    the self-check, else the generic one (one row:
    `batch > 1` is refused; `mode == "tree"` where `generic_tree_problem` finds one), announced
    on stderr."""
    problem = fast_engine_problem(model, aux_layer_ids, max_len)
    if problem is None:
        return TargetEngine(model, aux_layer_ids, max_len, batch=batch, compile=compile, fuse=fuse)
    name = type(model).__name__
    if batch > 1:
        raise UserError(
            f"--batch-size {batch} needs draftsmith's fast engine, which does not cover {name}: {problem}. "
            "The generic path decodes one row: use --batch-size 1"
        )
    engine = HFEngine(model, aux_layer_ids, max_len, reason=problem)
    tree_problem = generic_tree_problem(engine) if mode == "tree" else None
    if tree_problem is not None:
        raise UserError(
            f"--mode tree on {name}: the fast engine does not cover it ({problem}) and the generic path "
            f"cannot verify trees for it: {tree_problem}. Use --mode chain"
        )
    print(
        f"[eval] {name}: not on the fast engine ({problem}); decoding on the generic path instead "
        f"(the model's own forward with a DynamicCache: {mode}, one row, no CUDA graphs)",
        file=sys.stderr,
        flush=True,
    )
    return engine
