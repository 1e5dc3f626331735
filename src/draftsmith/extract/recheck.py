"""The store's periodic re-check: one sample's stored rows against a plain reference forward of
the target (one sample alone, unpadded, hook capture), for both capture engines."""

from __future__ import annotations

import torch

from draftsmith.runtime.capture import capture


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b|| in fp32."""
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm().clamp_min(1e-12))


def recheck(
    model: torch.nn.Module,
    ids: torch.Tensor,
    aux_layer_ids: list[int],
    aux: torch.Tensor,
    final: torch.Tensor,
    tol: float,
) -> str | None:
    """Re-run one sample alone, unpadded, and compare with its rows from the batch.
    ids [T]; aux [T, n_aux*H]; final [T, H]. Returns a reason on failure."""
    ref_aux, ref_final = capture(model, ids[None], None, aux_layer_ids)  # [1, T, n_aux*H], [1, T, H]
    errs = relative_error(aux, ref_aux[0]), relative_error(final, ref_final[0])
    if max(errs) > tol:
        return f"re-check against a single-sample forward failed: relative error aux {errs[0]:.2e}, final {errs[1]:.2e} > {tol:g}"
    return None
