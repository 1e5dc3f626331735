"""The loss weights of the TTT unroll's steps: step k weighs `step_decay**k` (train
--step-decay, `STEP_DECAY` by default).

One rule for the commands that unroll a drafter: `train`'s objective (train/loss.py) and its
logged `loss` (train/metrics.py, at the default), and `plan`'s calibration step, which times
the same unroll. The unroll itself (its inputs and attention per step) is train/ttt.py.
"""

from __future__ import annotations

STEP_DECAY = 0.8  # train --step-decay's default, and the weighting of the logged `loss`


def step_weights(ttt: int, step_decay: float = STEP_DECAY) -> list[float]:
    """The loss weight of each of `ttt` steps: [1, d, d², ...] for d = `step_decay`."""
    return [step_decay**k for k in range(ttt)]
