"""The walked acceptance: validation answers decoded the way a chain of K drafts decodes them.

The simulated τ (metrics.py) averages, over every answer position, how many drafts a chain
started there would get accepted. Decoding does not start a chain at every position: each
cycle starts where the last one's accepted drafts and the target's own token end, so a stretch
of easy tokens is crossed in few cycles and counts for little, a hard one in many. Measured τ
(tokens per target call, `draftsmith eval`) is that walk's average, and it is lower than the
simulated τ wherever acceptance is uneven. Walking the validation answers the same way gives
the training-distribution counterpart of eval's τ and its acceptance per position.

Alignment (ttt.py): step k at position t drafts token t+2+k; a cycle at t whose first a drafts
are accepted emits a+1 tokens (the accepted ones and the target's), and the next cycle starts
at t+a+1.
"""

from __future__ import annotations

import numpy as np
import torch


def walk_counts(runs: torch.Tensor, answer: torch.Tensor, ttt: int) -> tuple[torch.Tensor, torch.Tensor]:
    """runs [B, T]: drafts accepted from each position (its leading correct TTT steps, 0..K);
    answer [B, T] bool: position t drafts an answer token (t+2 is one, in the same sample).
    Each stretch of answer positions is walked from its first, cycle by cycle. Returns
    (cycles [K], reach [K]): the cycles walked (the same count at every k), and those whose
    first k+1 drafts were accepted."""
    runs_np, answer_np = runs.cpu().numpy(), answer.cpu().numpy()
    accepted = np.zeros(ttt + 1, dtype=np.int64)  # cycles by drafts accepted
    for row_runs, row_answer in zip(runs_np, answer_np, strict=True):
        t, n = 0, len(row_runs)
        while t < n:
            if row_answer[t]:
                accepted[row_runs[t]] += 1
                t += int(row_runs[t]) + 1
            else:
                t += 1
    reach = torch.tensor([accepted[k + 1 :].sum() for k in range(ttt)], dtype=torch.float64)
    return torch.full((ttt,), float(accepted.sum()), dtype=torch.float64), reach
