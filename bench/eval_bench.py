"""Benchmark of `draftsmith eval`'s engine, at batch size 1, all parts in the same run.

  plain   plain greedy decode tok/s: HF `generate` against the static-KV-cache engine with CUDA
          graphs (and eager, no graphs) and against the generic path (`HFEngine`: the model's
          own forward with a cropped DynamicCache, what targets the fast engine does not cover
          decode on), same prompts (MT-bench first turns), same token count (no early stop),
          prefill included on all sides; plus how many outputs equal HF's.
  verify  verification cost: one target forward of 1, 8, 32, 64 tokens after a 512-token
          context, graphed and eager (median ms).
  cycle   the cost of one draft-and-verify cycle, chain K=7 (greedy and at temperature 1),
          tree (60 tokens, depth 7, top-k 10) and, as `chain_walk`, the K=7 chain drafted as
          an adaptive one that never stops (eval --stop-below: a graph and a host read per
          step, each step queued before the last one's read, as on GPU by default; as
          `chain_walk_sync`, without that look-ahead), and as `tree_torch_topk` the tree with
          torch's top-k (`tree`'s is two small Triton kernels on CUDA), drafter step eager and compiled:
          cycle ms (decode time over cycles, greedy, MT-bench first turns), draft ms (the drafter's side alone: one `propose`, a graph replay on GPU),
          verify ms (the target's forward of the draft alone), glue ms = cycle - draft - verify
          (acceptance, KV compaction, staging the accepted rows, the host read, Python) and its
          parts timed alone (accept ms with the host read, compact ms, observe ms; for a tree also
          its draft's parts: one drafter step over the frontier, the top-k, the selection and the
          ancestor mask, each as a CUDA graph's replay on GPU), and the
          plain decoding ms per token of the same engine (greedy; the temperature-1 chain's
          speed-up is against it too); with --compile-target, again with the target's forward
          compiled inside its CUDA graphs (plain decoding and verification alike); with
          --drafter-widths, once per random drafter of each MLP width (WIDTH, or WIDTH:LAYERS for a
          drafter of that many decoder layers), all in one process (the drafting cost of a wider
          or deeper drafter: weights do not change it); with --fuse-ab, plain decoding with the
          target's projections unfused / fused / unfused, and with --compile-scope-ab, compiled
          whole / layer by layer (one decoder layer's step compiled for all) / whole: ms a
          token, the graphs' capture seconds (compiles included), greedy turns equal
  chain   `draftsmith eval` on MT-bench, chain K=7: tau, acceptance per position, speed-up
  tree    `draftsmith eval` on MT-bench, EAGLE-2 tree (60 tokens, depth 7, top-k 10): the same
  batch   (not in the default parts) `draftsmith eval` at each of --batch-sizes (default 1,4,16)
          for chain, tree and chain at temperature 1 (--batch-modes), each against plain
          decoding at the same batch size and temperature; batch_speedup.png in --out-dir

    python bench/eval_bench.py --target /root/m/SmolLM2-135M-Instruct.Q4_1.gguf --drafter DRAFTER --out-json bench_eval.json
    python bench/eval_bench.py --parts cycle --target ... --drafter DRAFTER   # the cycle breakdown alone (a few minutes)
    python bench/eval_bench.py --parts batch --target ... --drafter DRAFTER --out-dir runs/batch --num-questions 80
    python bench/eval_bench.py --parts cycle --cycle-shapes chain --drafter-widths 1536,6144,6144:2 --target ...   # the cycle per MLP width and layer count
    python bench/eval_bench.py --parts cycle --profile runs/profile --target ...   # and each shape's kernels, one turn under torch.profiler
    python bench/eval_bench.py --parts cycle --cycle-shapes chain,tree --cycle-rounds 4 --target ...   # A-B-A-B: the gap and its noise
    python bench/eval_bench.py --smoke --parts cycle,chain,tree,batch   # CPU, small sizes, random drafter: checks the script works

Without --drafter a random drafter is used (tau ~ 1: a speed-up floor, not a drafter's worth).
Prints one JSON object and writes it to --out-json.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from draftsmith.draft.checkpoint import load_drafter, save_drafter
from draftsmith.evaluate.config import EvalConfig
from draftsmith.evaluate.decode import Turn, plain_generate, spec_generate, tree_acceptance
from draftsmith.evaluate.fused_topk import checked_on
from draftsmith.evaluate.proposer import Draft, DrafterProposer, select_nodes, top_log_probs, tree_ancestors
from draftsmith.evaluate.questions import load_questions, turn_prompt
from draftsmith.evaluate.run import run as evaluate
from draftsmith.layers import default_aux_layers
from draftsmith.runtime.engine import Graphed, TargetEngine
from draftsmith.runtime.generic import HFEngine
from draftsmith.runtime.sampling import Sampling, read_verified, verify_chain_greedy, verify_chain_sampled
from draftsmith.target import load_target

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: the tests' untrained drafter
from tests.helpers import random_drafter


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def plain_decode(target, prompts: list[list[int]], new_tokens: int) -> dict:
    """tok/s of HF generate, our engine eager, our engine with CUDA graphs (prefill included)."""
    dev, model = target.device, target.model
    out: dict = {"prompts": len(prompts), "new_tokens": new_tokens}

    def timed(fn) -> tuple[float, list[list[int]]]:
        fn(prompts[0])  # warm-up
        sync(dev)
        t0, outs = time.perf_counter(), []
        for p in prompts:
            outs.append(fn(p))
        sync(dev)
        return len(prompts) * new_tokens / (time.perf_counter() - t0), outs

    def hf(p: list[int]) -> list[int]:
        ids = torch.tensor([p], device=dev)
        gen = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            eos_token_id=None,
            pad_token_id=0,
        )
        return gen[0, len(p) :].tolist()

    aux = default_aux_layers(target.info.num_layers)
    max_len = max(map(len, prompts)) + new_tokens + 8
    out["hf_generate_tok_per_s"], ref = timed(hf)
    eager = TargetEngine(model, aux, max_len)
    out["engine_eager_tok_per_s"], _ = timed(lambda p: plain_generate(eager, p, new_tokens, set(), Sampling()).tokens)  # noqa: F821 (timed before the del below)
    del eager
    if dev.type == "cuda":
        graphed = TargetEngine(model, aux, max_len)
        graphed.graph_rows(1)
        out["capture_seconds"] = round(graphed.capture_seconds, 3)
        out["engine_graphs_tok_per_s"], ours = timed(
            lambda p: plain_generate(graphed, p, new_tokens, set(), Sampling()).tokens
        )
        out["speedup_graphs_vs_hf"] = round(out["engine_graphs_tok_per_s"] / out["hf_generate_tok_per_s"], 3)
        del graphed
    else:
        ours = [
            plain_generate(TargetEngine(model, aux, max_len), p, new_tokens, set(), Sampling()).tokens for p in prompts
        ]
    out["outputs_equal_hf"] = f"{sum(a == b for a, b in zip(ours, ref, strict=True))}/{len(prompts)}"
    generic = HFEngine(model, aux, max_len, reason="bench: the generic path on a target the fast engine covers")
    out["generic_engine_tok_per_s"], theirs = timed(
        lambda p: plain_generate(generic, p, new_tokens, set(), Sampling()).tokens
    )
    out["generic_outputs_equal_hf"] = f"{sum(a == b for a, b in zip(theirs, ref, strict=True))}/{len(prompts)}"
    fast = out.get("engine_graphs_tok_per_s", out["engine_eager_tok_per_s"])
    out["speedup_fast_vs_generic"] = round(fast / out["generic_engine_tok_per_s"], 3)
    return {k: round(v, 2) if isinstance(v, float) else v for k, v in out.items()}


def verification_cost(target, sizes: list[int], context: int, reps: int) -> dict:
    """Median ms of one target forward of t tokens after `context` cached tokens."""
    dev = target.device
    engine = TargetEngine(target.model, default_aux_layers(target.info.num_layers), context + max(sizes) + 8)
    ctx = torch.randint(0, target.info.vocab_size, (context,), device=dev)
    out: dict = {"context": context}
    for graphs in [False, True] if dev.type == "cuda" else [False]:
        for t in sizes:
            if graphs:
                engine.graph(t)
            engine.prefill(ctx)
            ids = torch.randint(0, target.info.vocab_size, (t,), device=dev)
            slots = torch.arange(context, context + t, device=dev)
            mask = engine.causal_mask(context, t)
            times = []
            for _ in range(reps):
                sync(dev)
                t0 = time.perf_counter()
                engine.forward(ids, slots, slots, mask)
                sync(dev)
                times.append(time.perf_counter() - t0)
            out[f"{'graphs' if graphs else 'eager'}_ms_{t}"] = round(1000 * statistics.median(times[1:]), 3)
    return out


def median_ms(fn, device: torch.device, reps: int) -> float:
    """Median ms of fn() over reps calls (after one), each synchronised."""
    times = []
    for _ in range(reps + 1):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return round(1000 * statistics.median(times[1:]), 3)


def plain_decoding(engine: TargetEngine, prompts: list[list[int]], new_tokens: int, profile: Path | None) -> tuple:
    """Plain decoding of `prompts` at batch 1 on `engine` (its one-token graph captured on a GPU; a
    warm-up turn first): each turn's tokens, and {"ms_per_token"; with `profile`, "profile": one
    more turn's kernels (`profile_turn`) into that path}."""
    if engine.device.type == "cuda":
        engine.graph_rows(1)
    turns = [plain_generate(engine, p, new_tokens, set(), Sampling()) for p in [prompts[0], *prompts]][1:]
    out: dict = {"ms_per_token": round(1000 * sum(t.seconds for t in turns) / sum(len(t.tokens) - 1 for t in turns), 3)}
    if profile is not None:
        out["profile"] = profile_turn(
            engine.device, functools.partial(plain_generate, engine, prompts[0], new_tokens, set(), Sampling()), profile
        )
    return [t.tokens for t in turns], out


def engine_ab(
    target, prompts: list[list[int]], new_tokens: int, profile_dir: Path | None, variants: dict[str, dict]
) -> dict:
    """Plain decoding at batch 1 on the target engine as eval runs it (graphed; compiled on a GPU),
    once per variant of `variants` (name -> `TargetEngine` options), in one process: ms a token
    each, the seconds its graphs took to capture (the compiles inside them included), how many of
    its greedy turns equal the first variant's, and with `profile_dir` a plain turn's kernels each."""
    max_len = max(map(len, prompts)) + new_tokens + 80
    out: dict = {"turns": len(prompts)}
    first: list[list[int]] | None = None
    for name, options in variants.items():
        engine = TargetEngine(target.model, [], max_len, compile=target.device.type == "cuda", **options)
        turns, out[name] = plain_decoding(
            engine, prompts, new_tokens, profile_dir / f"plain_{name}" if profile_dir is not None else None
        )
        first = first or turns
        out[name] |= {
            "compiled": engine.compiled,
            "capture_seconds": round(engine.capture_seconds, 2),
            "greedy_turns_equal_first": sum(a == b for a, b in zip(turns, first, strict=True)),
        }
        del engine
    return out


def fuse_ab(target, prompts: list[list[int]], new_tokens: int, profile_dir: Path | None) -> dict:
    """`engine_ab` of the projections unfused / fused (`TargetEngine(fuse=True)`: q/k/v and gate/up
    as one product each, as vLLM runs them) / unfused again."""
    variants = {"unfused": {"fuse": False}, "fused": {"fuse": True}, "unfused_again": {"fuse": False}}
    out = engine_ab(target, prompts, new_tokens, profile_dir, variants)
    out["fused_over_unfused"] = round(out["unfused"]["ms_per_token"] / out["fused"]["ms_per_token"], 3)
    return out


def compile_scope_ab(target, prompts: list[list[int]], new_tokens: int, profile_dir: Path | None) -> dict:
    """`engine_ab` of the target compiled whole (each graph's forward: eval's compiled target) /
    layer by layer (`compile_scope="layers"`: one decoder layer's step compiled for all of them) /
    whole again: what regional compilation saves in capture time, and what it costs a token."""
    scopes = {"forward": "forward", "layers": "layers", "forward_again": "forward"}
    out = engine_ab(target, prompts, new_tokens, profile_dir, {k: {"compile_scope": v} for k, v in scopes.items()})
    out["layers_over_forward"] = round(out["forward"]["ms_per_token"] / out["layers"]["ms_per_token"], 3)
    return out


def cycle_breakdown(
    target,
    drafter_path: Path,
    prompts: list[list[int]],
    new_tokens: int,
    shapes: dict[str, dict],
    compile_modes: list[bool],
    reps: int,
    compile_target: bool = False,
    profile_dir: Path | None = None,
    on_row: Callable[[dict], None] | None = None,
    rounds: int = 1,
) -> dict:
    """Per shape and drafter-step compilation: cycle, draft, verify and glue ms (see the docstring),
    the glue's parts (`glue_parts`); with `compile_target`, the target's forward compiled inside its
    graphs (eval --compile-target); with `profile_dir`, a plain turn's and each shape's kernels (`profile_turn`).
    With `rounds` > 1 the shapes are timed that many times in turn (A-B-A-B: one shape's drift is the
    other's too), the first round in full, each round's cycle, draft, verify and glue ms in
    `out["rounds"][key]` (lists), their medians and spreads (max - min) in `out["rounds_median"]`, and
    each shape's cycle less the chain's of the same round and compilation in `out["rounds_minus_chain"]`."""
    dev, model = target.device, target.model
    drafter, _ = load_drafter(drafter_path, dev)
    drafter.to(dtype=target.dtype)
    graphs = dev.type == "cuda"
    max_len = max(map(len, prompts)) + new_tokens + 80
    engine = TargetEngine(model, drafter.config.aux_layer_ids, max_len, compile=compile_target)
    # a plain token's kernels with `profile_dir`: vLLM's plain step ran 0.97 ms of them (H200, 2026-12-06)
    profile = profile_dir / f"plain{'_target_compiled' if compile_target else ''}" if profile_dir is not None else None
    _, plain = plain_decoding(engine, prompts, new_tokens, profile)
    out: dict = {
        "prompts": len(prompts),
        "new_tokens": new_tokens,
        "target_compiled": engine.compiled,
        "plain_ms_per_token": plain["ms_per_token"],
        **({"plain_profile": plain["profile"]} if "profile" in plain else {}),
    }
    for r, name, compiled in ((r, n, c) for r in range(rounds) for n in shapes for c in compile_modes):
        shape, key = shapes[name], f"{name}{'_compiled' if compiled else ''}"
        sampling = Sampling(temperature=shape.get("temperature", 0.0), seed=0)  # the proposer's and the verification's
        prop = DrafterProposer(
            drafter, sampling, max_len, compile=compiled, **{k: v for k, v in shape.items() if k != "temperature"}
        )
        if graphs:
            engine.graph_rows(prop.size + 1)
            if prop.mode == "tree":
                engine.graph_compact(prop.path_len)
            prop.graph()
        turns = [spec_generate(engine, prop, p, new_tokens, set(), sampling) for p in [prompts[0], *prompts]][1:]
        cycles = sum(len(t.accepts) for t in turns)
        row = {
            "drafter_compiled": prop.compiled,
            "tau": round(sum(a + 1 for t in turns for a in t.accepts) / cycles, 3),
            "cycle_ms": round(1000 * sum(t.seconds for t in turns) / cycles, 3),
        }
        draft = prop.propose()  # the state the last turn left: one more cycle's inputs
        row["draft_ms"] = median_ms(prop.propose, dev, reps)
        at = torch.tensor(
            [len(prompts[-1]) + new_tokens], device=dev
        )  # past the last turn: slots nothing reads any more
        rows = torch.cat([draft.tokens[:, :1], draft.tokens], dim=1)  # [1, N+1]: a root and the draft
        block, offsets = (
            (None, None)
            if prop.mode == "chain"
            else (draft.anc, torch.cat([torch.zeros_like(draft.depths[:, :1]), draft.depths], dim=1))
        )
        row["verify_ms"] = median_ms(lambda: engine.rows_forward(rows, at * 0, at, block, offsets), dev, reps)
        row["glue_ms"] = round(row["cycle_ms"] - row["draft_ms"] - row["verify_ms"], 3)
        if rounds > 1:
            for part in ("cycle_ms", "draft_ms", "verify_ms", "glue_ms"):
                out.setdefault("rounds", {}).setdefault(key, {}).setdefault(part, []).append(row[part])
        if r == 0:  # the first round in full: the glue's and the tree's parts, the profile
            row.update(glue_parts(engine, prop, draft, rows, at, block, offsets, sampling, reps))
            if prop.mode == "tree":
                row["tree_parts"] = tree_parts(prop, reps)
            if profile_dir is not None:
                row["profile"] = profile_turn(
                    dev,
                    functools.partial(spec_generate, engine, prop, prompts[0], min(new_tokens, 32), set(), sampling),
                    profile_dir / f"{key}{'_target_compiled' if compile_target else ''}",
                )
            row["speedup_vs_plain"] = round(row["tau"] * out["plain_ms_per_token"] / row["cycle_ms"], 3)
            out[key] = row
        if rounds > 1:  # derived again after each row, so that a run cut short keeps them
            out.update(round_summary(out["rounds"]))
        if on_row is not None:  # what is measured so far, kept should the run be cut short
            on_row(out)
        del prop
    return out


def spread(values: list[float]) -> dict:
    """The median of values and their spread (max - min), in ms."""
    return {"median": round(statistics.median(values), 3), "spread": round(max(values) - min(values), 3)}


def round_summary(rounds: dict[str, dict[str, list[float]]]) -> dict:
    """From each row's ms per round (`rounds[key][part]`): their medians and spreads
    (`rounds_median`), and each shape's cycle less the chain's of the same round and compilation
    (`rounds_minus_chain`; issue 53's tree goal: +0.5 ms)."""

    def chain_of(key: str) -> dict[str, list[float]] | None:
        return rounds.get("chain_compiled" if key.endswith("_compiled") else "chain")

    return {
        "rounds_median": {k: {p: spread(v) for p, v in parts.items()} for k, parts in rounds.items()},
        "rounds_minus_chain": {
            k: spread([a - b for a, b in zip(parts["cycle_ms"], chain["cycle_ms"], strict=False)])
            for k, parts in rounds.items()
            if (chain := chain_of(k)) is not None and chain is not parts
        },
    }


def glue_parts(
    engine: TargetEngine,
    prop: DrafterProposer,
    draft: Draft,
    rows: torch.Tensor,
    at: torch.Tensor,
    block: torch.Tensor | None,
    offsets: torch.Tensor | None,
    sampling: Sampling,
    reps: int,
) -> dict:
    """The glue of one cycle by part, each timed alone (median ms): `accept_ms` the acceptance rule
    on the verification's logits with its one host read (a tree's as eval runs it,
    `tree_acceptance`: with its compaction and the path's aux states, one graph when greedy on a
    GPU), `compact_ms` the KV compaction of a tree's accepted path alone (a graph replay; 0 for a
    chain), `observe_ms` staging the accepted rows for the drafter. rows [1, N+1]: a root and the
    draft, verified at slot `at` [1] (past every turn: the compactions there touch no turn's cache)."""
    dev = engine.device
    logits, aux = engine.rows_forward(rows, at * 0, at, block, offsets)  # [1, N+1, V], [1, N+1, n_aux*H]
    logits, aux = logits.clone(), aux.clone()  # the graph's outputs are overwritten by its next replay
    if prop.mode == "chain":
        accept = (
            functools.partial(verify_chain_greedy, draft.tokens, logits)
            if sampling.greedy
            else functools.partial(verify_chain_sampled, draft.tokens, draft.q, logits, sampling)
        )
        out: dict = {"compact_ms": 0.0}
    else:
        tree = tree_acceptance(engine, prop.size, prop.path_len, sampling)
        inputs = (draft.tokens, draft.parents, draft.depths, draft.anc, logits, aux, at * 0, at)
        accept = lambda: read_verified(*tree(*inputs)[:2])  # noqa: E731
        path = at[:, None] + torch.arange(prop.path_len, device=dev)  # [1, path_len]: slots past every turn
        out = {"compact_ms": median_ms(lambda: engine.compact(path, path), dev, reps)}
    out["accept_ms"] = median_ms(accept, dev, reps)
    staged = aux[:, : prop.path_len], rows[:, : prop.path_len], torch.ones_like(at)
    out["observe_ms"] = median_ms(lambda: prop.observe(*staged), dev, reps)
    return out


def part_ms(fn, *args: torch.Tensor, reps: int) -> float:
    """Median ms of fn(*args): on CUDA as a CUDA graph's replay (the device's time, no launch
    overhead: what the part costs inside the graphed cycle), on CPU eagerly."""
    dev = args[0].device
    if dev.type != "cuda":
        return median_ms(lambda: fn(*args), dev, reps)
    graphed = Graphed(fn, *args)
    return median_ms(graphed.graph.replay, dev, reps)


def slice_max_topk(x: torch.Tensor, k: int, width: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """The top k of x [..., V] (V a multiple of `width`, k slices or more) from the k `width`-wide
    slices with the largest maxima, which hold all of them (a slice holding one of the k best has
    a maximum at least that large): a max reduction over V and two small top-k's (over V/width
    slice maxima, then k*width values) instead of one top-k over V."""
    *lead, v = x.shape
    slices = x.view(*lead, v // width, width)  # [..., V/w, w]
    best_slices = slices.amax(-1).topk(k, dim=-1).indices  # [..., k]
    cand = slices.gather(-2, best_slices[..., None].expand(*lead, k, width))  # [..., k, w]
    best, at = cand.flatten(-2).topk(k, dim=-1)  # [..., k]
    return best, best_slices.gather(-1, at // width) * width + at % width


@torch.no_grad()
def tree_parts(prop: DrafterProposer, reps: int) -> dict:
    """A tree draft's parts, each timed alone on inputs of its shapes (`part_ms`): one drafter step
    over the k frontier nodes (`step_ms`, done depth-1 times a cycle), the top-k of its logits as
    log-probs (`topk_ms`, per depth; and its parts: the top-k alone, the logsumexp alone, and the
    top-k from the slices with the largest maxima, checked against the top-k first, where the draft
    vocabulary is k or more slices of 128; and on CUDA the same in two small Triton kernels where
    `checked_on` finds they give torch's), the selection of the kept nodes from the pool
    (`select_ms`, once) and their ancestor mask (`ancestors_ms`, once)."""
    b, k, dev = prop.batch, prop.top_k, prop.device
    cfg = prop.drafter.config
    s = prop.cols.shape[0]
    hidden = torch.randn(b, k, cfg.hidden_size, device=dev, dtype=prop.dtype)
    ids = torch.zeros(b, k, dtype=torch.long, device=dev)
    pos = torch.full((b, k), 8, device=dev)
    slots = (prop.max_len + torch.arange(k, device=dev)).expand(b, k).contiguous()
    mask = torch.ones(b, k, s, dtype=torch.bool, device=dev)
    logits = torch.randn(b, k, cfg.draft_vocab_size, device=dev)
    p = prop.pool_depths.shape[0]
    scores = torch.randn(b, p, device=dev).sort(dim=1, descending=True).values  # deeper nodes score lower
    tokens = torch.randint(0, cfg.vocab_size, (b, p), device=dev)
    parents = (torch.arange(p, device=dev) // k - 1).clamp(min=-1).expand(b, p).contiguous()  # a valid forest
    rows = torch.arange(prop.size, device=dev).expand(b, prop.size).contiguous()  # each node's parent: the row before
    sliced = cfg.draft_vocab_size % 128 == 0 and cfg.draft_vocab_size // 128 >= k
    if sliced:  # the same k best as one top-k over the vocabulary (random logits: no ties)
        assert torch.equal(slice_max_topk(logits, k)[1], logits.topk(k).indices), "slice_max_topk is not the top-k"
    # the same k best and log-probs in two small Triton kernels, where they give torch's (eval's own check)
    fused = checked_on(dev, k, cfg.draft_vocab_size, top_log_probs) if dev.type == "cuda" else None
    return {
        "step_ms": part_ms(prop._step, hidden, ids, pos, slots, mask, reps=reps),
        "topk_ms": part_ms(lambda x: top_log_probs(x, k), logits, reps=reps),
        # what the top-k as log-probs is made of, and a top-k from the slices with the largest maxima
        # that the tree's draft would use if it is cheaper (a two-stage top-k, the best k of each
        # slice then of those, was not: 0.061 against 0.060 ms, H100, 2026-12-07 07:52)
        "topk_only_ms": part_ms(lambda x: x.topk(k), logits, reps=reps),
        "logsumexp_ms": part_ms(lambda x: x.logsumexp(-1), logits, reps=reps),
        "topk_slice_max_ms": part_ms(lambda x: slice_max_topk(x, k), logits, reps=reps) if sliced else None,
        # the top-k as log-probs in two small Triton kernels (evaluate/fused_topk.py), where Triton runs
        "topk_fused_ms": part_ms(lambda x: fused(x, k), logits, reps=reps) if fused else None,
        "select_ms": part_ms(
            lambda *x: select_nodes(*x, prop.pool_depths, prop.size), scores, tokens, parents, reps=reps
        ),
        "ancestors_ms": part_ms(lambda x: tree_ancestors(x, prop.depth), rows, reps=reps),
    }


def profile_turn(dev: torch.device, generate: Callable[[], Turn], out: Path) -> dict:
    """One turn (`generate()`, speculative or plain) under torch.profiler: `out`.txt, the table of
    kernels by device time, and `out`.json, the trace (chrome://tracing, Perfetto). Returns the
    turn's steps (speculative cycles, or plain tokens after the first), device kernels per step,
    kernel ms per step and wall ms per step (wall - kernels: the device idle, waiting on the host)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    sync(dev)
    with profile(activities=activities) as prof:
        turn = generate()
        sync(dev)
    steps = len(turn.accepts) or len(turn.tokens) - 1
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    sort = "self_device_time_total" if kernels else "self_cpu_time_total"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".txt").write_text(prof.key_averages().table(sort_by=sort, row_limit=60, max_name_column_width=90))
    prof.export_chrome_trace(str(out.with_suffix(".json")))
    return {
        "steps": steps,
        "kernels_per_step": round(len(kernels) / steps, 1),
        "kernel_ms_per_step": round(sum(e.self_device_time_total for e in kernels) / 1000 / steps, 3),
        "wall_ms_per_step": round(1000 * turn.seconds / steps, 3),
        "table": str(out.with_suffix(".txt")),
    }


def spec_run(args: argparse.Namespace, drafter: Path, out: Path, **mode: object) -> dict:
    cfg = EvalConfig(
        target=args.target,
        drafter=drafter,
        out=out,
        num_questions=args.num_questions,
        max_new_tokens=args.max_new_tokens,
        device=args.device,
        overwrite=True,
        **mode,
    )
    evaluate(cfg)
    r = json.loads((out / "report.json").read_text())
    keys = (
        "mode",
        "batch_size",
        "temperature",
        "tau",
        "accept_per_position",
        "spec_tok_per_s",
        "plain_tok_per_s",
        "speedup",
        "steps",
        "tokens",
        "greedy_turns_matching_plain",
        "greedy_turns_checked",
        "drafter_compiled",
        "capture_seconds",
        "warmup_seconds",
        "wall_seconds",
        "kv_cache_len",
    )
    return {k: r[k] for k in keys} | {"report": str(out / "report.json")}


def batch_runs(args: argparse.Namespace, drafter: Path, out_dir: Path, shapes: dict[str, dict]) -> dict:
    """`draftsmith eval` per --batch-modes entry (chain, tree, chain_t1: chain at temperature 1
    with its own plain pass) and --batch-sizes, each against plain decoding at the same batch
    size; the speed-ups plotted against the batch size (batch_speedup.png in --out-dir)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = [int(b) for b in args.batch_sizes.split(",")]
    modes = {"chain": shapes["chain"], "tree": shapes["tree"], "chain_t1": {**shapes["chain"], "temperature": 1.0}}
    runs: dict = {}
    fig, ax = plt.subplots(figsize=(6, 4))
    for name in args.batch_modes.split(","):
        for b in sizes:
            runs[f"{name}_b{b}"] = spec_run(args, drafter, out_dir / f"{name}_b{b}", batch_size=b, **modes[name])
        ax.plot(sizes, [runs[f"{name}_b{b}"]["speedup"] or float("nan") for b in sizes], "o-", label=name)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set(
        xscale="log",
        xticks=sizes,
        xticklabels=[str(b) for b in sizes],
        xlabel="batch size (rows, each its own question)",
        ylabel="speed-up over plain decoding",
        title="speculative decoding against plain, same batch size",
    )
    ax.legend()
    fig.tight_layout()
    fig.savefig(out_dir / "batch_speedup.png", dpi=100)
    plt.close(fig)
    runs["plot"] = str(out_dir / "batch_speedup.png")
    return runs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--drafter", type=Path, help="drafter folder (train output or export); default: random drafter")
    ap.add_argument("--device", default=None)
    ap.add_argument("--num-questions", type=int, default=80)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--plain-prompts", type=int, default=5)
    ap.add_argument("--plain-tokens", type=int, default=256)
    ap.add_argument("--parts", default="plain,verify,cycle,chain,tree", help="also: batch")
    ap.add_argument("--cycle-shapes", default="chain,tree,chain_t1", help="--parts cycle: the shapes it times")
    ap.add_argument(
        "--drafter-widths",
        default=None,
        help="--parts cycle: comma-separated MLP widths, each WIDTH or WIDTH:LAYERS (decoder layers, default 1); "
        "times a random drafter of each (no --drafter)",
    )
    ap.add_argument(
        "--profile",
        type=Path,
        default=None,
        help="--parts cycle: also profile one turn per shape (torch.profiler), a kernel table and a trace per shape in this folder",
    )
    ap.add_argument(
        "--cycle-rounds",
        type=int,
        default=1,
        help="--parts cycle: time the shapes this many times in turn (A-B-A-B): each round's ms, their medians "
        "and spreads, and each shape's cycle less the chain's (the result's rounds, rounds_median, rounds_minus_chain)",
    )
    ap.add_argument("--batch-sizes", default="1,4,16", help="--parts batch: the batch sizes")
    ap.add_argument(
        "--batch-modes", default="chain,tree,chain_t1", help="--parts batch: chain, tree, chain_t1 (temperature 1)"
    )
    ap.add_argument("--out-dir", type=Path, default=None, help="where the eval reports go (default: a temp folder)")
    ap.add_argument("--out-json", type=Path, default=None)
    ap.add_argument(
        "--compile-target",
        action="store_true",
        help="--parts cycle: also the cycle with the target's forward compiled in its graphs (eval --compile-target)",
    )
    ap.add_argument(
        "--fuse-ab",
        action="store_true",
        help="--parts cycle: also plain decoding with the target's projections unfused / fused / unfused (fuse_ab)",
    )
    ap.add_argument(
        "--compile-scope-ab",
        action="store_true",
        help="--parts cycle: also plain decoding with the target compiled whole / layer by layer / whole (compile_scope_ab)",
    )
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny sizes: checks that the script runs")
    args = ap.parse_args()
    if args.cycle_rounds < 1:
        ap.error(f"--cycle-rounds {args.cycle_rounds}: give 1 or more (1: each shape timed once)")
    if args.smoke:
        args.device, args.num_questions, args.max_new_tokens, args.plain_prompts, args.plain_tokens = "cpu", 1, 8, 1, 8
        args.batch_sizes = "1,2"
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    args.device = str(device)
    out_dir = args.out_dir or Path(tempfile.mkdtemp(prefix="eval_bench_"))
    parts = set(args.parts.split(","))
    # (MLP width, decoder layers) per entry: "6144" is one layer, "6144:2" two
    widths = (
        [(int(w.split(":")[0]), int(w.split(":")[1]) if ":" in w else 1) for w in args.drafter_widths.split(",")]
        if args.drafter_widths
        else []
    )
    if widths and (args.drafter or args.compile_target or parts != {"cycle"}):
        sys.exit(
            "--drafter-widths times random drafters in --parts cycle alone: leave out --drafter, --compile-target and the other parts"
        )

    t0 = time.perf_counter()
    target = load_target(args.target, device)
    result: dict = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "target": args.target,
        "dtype": str(target.dtype).removeprefix("torch."),
        "load_seconds": round(time.perf_counter() - t0, 2),
    }

    def save(partial: dict | None = None) -> None:
        """--out-json: the result so far (and a part still running), rewritten after each shape
        timed, so that a run its time limit cuts keeps what it measured."""
        if args.out_json:
            args.out_json.write_text(json.dumps({**result, **(partial or {})}, indent=2) + "\n")

    if "plain" in parts:
        prompts = [
            turn_prompt(target.tokenizer, q.turns[:1], []) for q in load_questions("mt_bench", args.plain_prompts)
        ]
        result["plain_decode"] = plain_decode(target, prompts, args.plain_tokens)
    if "verify" in parts:
        sizes, context, reps = ([1, 8], 64, 3) if args.smoke else ([1, 8, 32, 64], 512, 50)
        result["verification_cost"] = verification_cost(target, sizes, context, reps)
    drafter = args.drafter
    if drafter is None and not widths and parts & {"chain", "tree", "cycle", "batch"}:
        drafter = save_drafter(
            random_drafter(target.model, 32000).cpu(), out_dir / "random_drafter", target=target.info.to_dict()
        )
        result["drafter_note"] = "random drafter (tau ~ 1)"
    result["drafter"] = f"random drafters of (MLP width, layers) {widths} (tau ~ 1)" if widths else str(drafter)
    shapes = {
        "chain": dict(mode="chain", depth=2 if args.smoke else 7),
        "tree": dict(mode="tree", depth=3, top_k=3, total_tokens=8)
        if args.smoke
        else dict(mode="tree", depth=7, top_k=10, total_tokens=60),
    }
    if "cycle" in parts:
        prompts = [
            turn_prompt(target.tokenizer, q.turns[:1], []) for q in load_questions("mt_bench", args.plain_prompts)
        ]
        compile_modes = [False, True] if device.type == "cuda" else [False]
        # chain_walk: the chain as an adaptive one (eval --stop-below) that never stops, each step its own graph
        # and host read: its cycle less the chain's is what adaptivity costs. A greedy draft's probability is
        # >= 1/32000, so K <= 8 drafts never fall below float32's smallest normal
        walk = {**shapes["chain"], "stop_below": float(torch.finfo(torch.float32).tiny)}
        known = {
            **shapes,
            "chain_t1": {**shapes["chain"], "temperature": 1.0},
            "chain_walk": walk,
            "chain_walk_sync": {**walk, "lookahead": False},  # each step launched after the last one's read
            # the tree with torch's top-k (tree's, on CUDA: two small Triton kernels, evaluate/fused_topk.py)
            "tree_torch_topk": {**shapes["tree"], "fused_topk": False},
        }
        names = args.cycle_shapes.split(",")
        if not set(names) <= known.keys():
            sys.exit(
                f"--cycle-shapes: {', '.join(sorted(set(names) - known.keys()))} unknown; choose from {', '.join(known)}"
            )
        cycle_shapes = {name: known[name] for name in names}
        reps = 3 if args.smoke else 50
        timed = {
            f"cycle_mlp_{w}" + (f"_layers_{n}" if n > 1 else ""): save_drafter(
                random_drafter(target.model, 32000, intermediate_size=w, num_layers=n).cpu(),
                out_dir / f"random_drafter_{w}_{n}",
                target=target.info.to_dict(),
            )
            for w, n in widths
        } or {"cycle": drafter}
        for (
            key,
            path,
        ) in timed.items():  # several: side by side in the same process, each against its own plain decoding
            result[key] = cycle_breakdown(
                target,
                path,
                prompts,
                args.plain_tokens,
                cycle_shapes,
                compile_modes,
                reps,
                profile_dir=args.profile,
                on_row=lambda rows, key=key: save({key: rows}),
                rounds=args.cycle_rounds,
            )
        if args.fuse_ab:
            result["fuse_ab"] = fuse_ab(target, prompts, args.plain_tokens, args.profile)
            save()
        if args.compile_scope_ab:
            result["compile_scope_ab"] = compile_scope_ab(target, prompts, args.plain_tokens, args.profile)
            save()
        if args.compile_target:  # side by side in the same process: the compiled drafter step only
            result["cycle_target_compiled"] = cycle_breakdown(
                target,
                drafter,
                prompts,
                args.plain_tokens,
                cycle_shapes,
                compile_modes[-1:],
                reps,
                compile_target=True,
                profile_dir=args.profile,
                on_row=lambda rows: save({"cycle_target_compiled": rows}),
            )
    del target
    evals = shapes  # EvalConfig's names
    if "chain" in parts:
        result["chain"] = spec_run(args, drafter, out_dir / "chain", **evals["chain"])
    if "tree" in parts:
        result["tree"] = spec_run(args, drafter, out_dir / "tree", **evals["tree"])
    if "batch" in parts:
        result["batch"] = batch_runs(args, drafter, out_dir, evals)
    save()
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
