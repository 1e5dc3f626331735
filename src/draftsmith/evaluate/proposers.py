"""`eval`'s part of each drafter method (draft/methods.py): the proposer that drafts with it.

`PROPOSERS[name](drafter, sampling, max_len, shape, compile, batch)` is a graphed proposer of
the draft shape `shape` (a chain, or a tree for a method that drafts trees): `DrafterProposer`
for EAGLE-3, `ParallelProposer` for P-EAGLE (proposer.py), `DFlashProposer` for DFlash
(dflash_proposer.py). `compile`: the drafter step through `torch.compile`, where the proposer has
a compiled form.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from draftsmith.evaluate.dflash_proposer import DFlashProposer
from draftsmith.evaluate.proposer import DrafterProposer, ParallelProposer, StagedCycle
from draftsmith.evaluate.shape import Shape
from draftsmith.runtime.sampling import Sampling

MakeProposer = Callable[[Any, Sampling, int, Shape, bool, int], StagedCycle]


def eagle_proposer(cls: type[DrafterProposer]) -> MakeProposer:
    """The proposer `cls` (a chain, or a tree when `shape` has a top-k) of an EAGLE-3 module."""

    def make(drafter: Any, sampling: Sampling, max_len: int, shape: Shape, compile: bool, batch: int) -> StagedCycle:
        return cls(
            drafter,
            sampling,
            max_len,
            mode="chain" if shape.top_k is None else "tree",
            depth=shape.depth,
            top_k=shape.top_k or 1,
            total_tokens=shape.total_tokens or shape.depth,
            compile=compile,
            batch=batch,
            stop_below=shape.stop_below,
        )

    return make


def dflash_proposer(
    drafter: Any, sampling: Sampling, max_len: int, shape: Shape, compile: bool, batch: int
) -> StagedCycle:
    """A chain of `shape.depth` from one block forward (the DFlash step has no compiled form)."""
    assert shape.stop_below is None, "one forward drafts the block: nothing to stop early"
    return DFlashProposer(drafter, sampling, max_len, shape.depth, batch)


PROPOSERS: dict[str, MakeProposer] = {
    "eagle3": eagle_proposer(DrafterProposer),
    "peagle": eagle_proposer(ParallelProposer),
    "dflash": dflash_proposer,
}
