"""The engine self-check: before `eval` or `synth` trusts draftsmith's fast static-KV engine
(engine.py) with a target, the engine must reproduce the model's own forward. When it does
not, they fall back to a generic path and say so: never wrong logits in silence.

Three checks, cheapest first; the first that fails gives the reason: the structure
(`engine.check_supported`), the config (`config_gaps`: settings the fast engine does not
implement, such as Granite's multipliers), and the logits (`logits_gap`: a random prompt,
prefilled through the fast engine and continued by a chain forward from its cache, against
`model(...)`, logits and aux hidden states within the dtype's tolerance, past the sliding
window where the run goes past it). What each check covers: docs/eval.md, "How it works".

`fast_engine_problem` is the verdict: `open_engine` (engine_choice.py) builds eval's engine from
it, and synth generates with the model's own `generate` when it names a problem.
`generic_tree_problem` checks the generic path for draft trees.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from draftsmith.errors import UserError
from draftsmith.runtime.capture import hooked
from draftsmith.runtime.engine import TargetEngine, check_supported, sliding_layers
from draftsmith.runtime.generic import HFEngine
from draftsmith.target import text_config

CHECK_PREFILL, CHECK_CHAIN = 24, 8  # tokens of the check prompt: a prefill, then a chain forward from the cache
# the largest |fast - model| allowed, as a fraction of the largest |model| value (logits, aux states)
TOLERANCE = {torch.float32: 1e-3, torch.float16: 1e-2, torch.bfloat16: 5e-2}
# config settings the fast engine ignores, with the value at which ignoring them is exact
ASSUMED: dict[str, Any] = {"embedding_multiplier": 1, "residual_multiplier": 1, "logits_scaling": 1}


def config_gaps(model: nn.Module) -> list[str]:
    """What the model's config asks for that the fast engine does not do. Empty when nothing
    is known to be missing."""
    tc = text_config(model.config)
    gaps = [f"{k}={getattr(tc, k)}" for k, v in ASSUMED.items() if getattr(tc, k, v) != v]
    if getattr(tc, "use_bidirectional_attention", None):  # Gemma-3 embedding models: the engine's mask is causal
        gaps.append("use_bidirectional_attention=True")
    other = sorted(set(getattr(tc, "layer_types", None) or []) - {"full_attention", "sliding_attention"})
    if other:
        gaps.append(f"layer_types {other}")
    no_rope = getattr(tc, "no_rope_layers", None)
    if no_rope and not all(no_rope):
        gaps.append("layers without rotary embeddings (no_rope_layers)")
    return gaps


def relative_error(ours: torch.Tensor, ref: torch.Tensor) -> float:
    """max |ours - ref| / max |ref|, in float32."""
    ours, ref = ours.float(), ref.float()
    return float((ours - ref).abs().max() / ref.abs().max().clamp_min(torch.finfo(torch.float32).tiny))


@torch.no_grad()
def logits_gap(model: nn.Module, aux_layer_ids: list[int], max_len: int = 0) -> str | None:
    """Run a random prompt through a small fast engine (a prefill of CHECK_PREFILL tokens, plus
    the sliding window when a run over `max_len` tokens goes past it; then a chain forward of
    CHECK_CHAIN from its cache) and through `model(...)`; the gap between their logits or aux
    states (layers `aux_layer_ids`), or None within tolerance."""
    p = next(model.parameters())
    tol = TOLERANCE.get(p.dtype, TOLERANCE[torch.float16])
    window, _ = sliding_layers(model)
    prefill = CHECK_PREFILL + (window if window is not None and window < max_len else 0)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, int(text_config(model.config).vocab_size), (prefill + CHECK_CHAIN,), generator=gen).to(
        p.device
    )
    engine = TargetEngine(model, aux_layer_ids, prefill + CHECK_CHAIN + 1)
    head, head_aux = engine.prefill(ids[:prefill])  # [P, V], [P, n_aux*H]
    tail, tail_aux = engine.chain(ids[prefill:], prefill)  # [C, V], [C, n_aux*H]
    with hooked(model, aux_layer_ids) as captured:
        ref = model(input_ids=ids[None], use_cache=False).logits[0]  # [P+C, V]
    compared = [("logits", torch.cat([head, tail]), ref)]
    if aux_layer_ids:
        ref_aux = torch.cat([captured[k][0] for k in aux_layer_ids], dim=-1)  # [P+C, n_aux*H]
        compared.append((f"hidden states at layers {aux_layer_ids}", torch.cat([head_aux, tail_aux]), ref_aux))
    for what, ours, theirs in compared:
        err = relative_error(ours, theirs)
        if not err <= tol:  # NaN fails too
            return (
                f"its {what} differ from the model's own forward by {err:.2g} of the largest value "
                f"(tolerance {tol:g} in {str(p.dtype).removeprefix('torch.')})"
            )
    return None


@torch.no_grad()
def generic_tree_problem(engine: HFEngine) -> str | None:
    """Why `engine`'s model cannot verify draft trees on the generic path, or None: a root and
    two siblings after a short prompt, in one tree forward, against each sibling run as a
    chain after the root (logits within the dtype's tolerance); and a cache whose every layer
    keeps every position (compaction moves the accepted path by position)."""
    dev, vocab = engine.device, engine.vocab_size
    prompt = (torch.arange(6, device=dev) * 31 + 7) % vocab  # [6]
    nodes = (torch.arange(3, device=dev) * 17 + 3) % vocab  # [3]: the root, sibling a, sibling b
    engine.prefill(prompt)
    if any(getattr(layer, "is_sliding", False) or not hasattr(layer, "keys") for layer in engine.cache.layers):
        return "its cache has sliding-window layers, which keep only their window (a tree's accepted path is moved by position)"
    anc = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool, device=dev)  # [3, 3]: ancestors or self
    tree, _ = engine.tree(nodes, len(prompt), anc, torch.tensor([0, 1, 1], device=dev))  # [3, V]
    alone = [engine.chain(nodes[[0, j]], len(prompt))[0][1] for j in (1, 2)]  # each sibling after the root alone: [V]
    err = max(relative_error(tree[j], ref) for j, ref in zip((1, 2), alone, strict=True))
    tol = TOLERANCE.get(engine.dtype, TOLERANCE[torch.float16])
    if not err <= tol:  # NaN fails too
        return f"it does not honour a 4-D attention mask over a draft tree (siblings differ by {err:.2g} of the largest logit)"
    return None


def fast_engine_problem(model: nn.Module, aux_layer_ids: list[int], max_len: int) -> str | None:
    """Why the fast engine cannot stand in for `model` in a run over up to `max_len` tokens,
    or None when it can."""
    try:
        check_supported(model)
    except UserError as e:
        return str(e)
    gaps = config_gaps(model)
    if gaps:
        return "its config sets what the fast engine ignores: " + ", ".join(gaps)
    try:
        return logits_gap(model, aux_layer_ids, max_len)
    except Exception as e:  # the fast engine crashing on a model (shapes, missing modules) means it does not cover it
        return f"the fast engine fails on it: {type(e).__name__}: {e}"
