"""The P-EAGLE draft (draft/peagle.py) in the proposer's cycle: one drafter forward over K-1
placeholder slots after step 0, instead of a chain's K-1 steps.

`parallel_from` takes the place of `DrafterProposer._chain_from` (same arguments, same outputs:
the K target ids and, sampling, the distribution each was drawn from). Draft 1 comes from step
0's output at each row's last observed position, as in a chain; drafts 2..K from one step over
the K-1 slots, each at a chain's draft slot, position and mask (draft step i of a chain: slot
max_len+i, position n+i, the context and draft slots 0..i), which is vLLM's causal attention over
its parallel slots. Fixed shapes, no host sync: the cycle stays one CUDA graph.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from draftsmith.draft.peagle import placeholder_inputs
from draftsmith.runtime.sampling import race

if TYPE_CHECKING:
    from draftsmith.evaluate.proposer import DrafterProposer


def parallel_from(
    prop: DrafterProposer,
    logits: torch.Tensor,
    hidden: torch.Tensor,
    base: torch.Tensor,
    n: torch.Tensor,
    step: Callable | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """K drafts of a P-EAGLE drafter for `prop` from step 0's logits [B, Vd] at each row's last
    observed position (`hidden`, its output, is not read: no slot reads another's output); n [B]:
    positions observed. Returns the target ids [B, K] and, sampling, their distributions [B, K, V]."""
    step = step or prop._step
    b, s, k = n.shape[0], prop.cols.shape[0], prop.depth
    rows = [logits]  # [B, Vd] per draft
    if k > 1:
        ids, slot_hidden = placeholder_inputs(prop.drafter, prop.chain_slots[:, 0].expand(b, k - 1), prop.dtype)
        masks = prop._context(base, n)[:, None] | prop.chain_masks  # [B, K-1, S16]: context, slots 0..i
        pos = n[:, None] + prop.chain_steps[:, 0]  # [B, K-1]: slot i at position n+i
        slots = prop.chain_slots[:, 0].expand(b, k - 1)  # [B, K-1]
        par, _ = step(slot_hidden, ids, pos, slots, masks[..., :s])  # [B, K-1, Vd]
        rows += list(par.unbind(1))
    tokens, qs = [], []
    for i, row in enumerate(rows):
        if prop.noise is None:
            d = row.argmax(-1)  # [B]
        else:
            q_d = prop.sampling.probs(row)  # [B, Vd]
            d = race(q_d, prop.noise[:, i])  # [B]: a draw from q_d
            qs.append(torch.zeros(b, prop.vocab_size, device=prop.device).index_copy_(1, prop.vocab_map, q_d))
        tokens.append(prop.vocab_map.index_select(0, d))  # [B] target ids
    q = torch.stack(qs, dim=1) if qs else None  # [B, K, V]
    return torch.stack(tokens, dim=1), q  # [B, K]
