"""`draftsmith eval`: answer a question set with lossless speculative decoding (chain or
EAGLE-2 tree) and with plain decoding, on the same engine, and report tau, acceptance per
position and the decode speed-up. The engine is the static-KV-cache one when it passes its
self-check on the target, else the generic HF path (runtime/engine_choice.py).

    resolve_questions, candidate_shapes -> load the entrants (--drafter, each --compare) + target
    (fit_to_target)
    -> open_decoding: engine (self-check) of --batch-size rows; per entrant the draft shape
       (--depth auto / --tree auto: a calibration) and its proposer (+ CUDA graphs on GPU) -> warm_up
    -> answer_all: turn by turn, in batches of rows that each decode their own question:
       every question's speculative answers by each entrant, then its plain answers (timed)
    -> per entrant turn_rows, report_meta -> report.json, report.md, acceptance.png, tau.png,
       answers.jsonl (--drafter's in OUT, each --compare drafter's in OUT/compare/NAME); with
       --compare, the side-by-side compare.json, compare.md, compare.png in OUT
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from draftsmith.config import write_run_record
from draftsmith.data.chat import check_template_options
from draftsmith.draft.checkpoint import load_drafter
from draftsmith.draft.methods import check_depth, deepest, method_of, trained_depth
from draftsmith.errors import UserError
from draftsmith.evaluate.config import EvalConfig
from draftsmith.evaluate.decode import Turn, decode, decode_all
from draftsmith.evaluate.heldout import HELD_OUT, held_out_questions
from draftsmith.evaluate.proposer import StagedCycle
from draftsmith.evaluate.proposers import PROPOSERS
from draftsmith.evaluate.questions import Question, load_questions, token_bound, turn_prompt
from draftsmith.evaluate.report import (
    ReportMeta,
    build_report,
    options_meta,
    summary_line,
    write_comparison,
    write_report,
)
from draftsmith.evaluate.shape import Calibration, Shape, calibrate, spread, with_adaptive
from draftsmith.evaluate.shape import summary as shape_summary
from draftsmith.fsutil import atomic_output_dir, atomic_write_text
from draftsmith.layers import validate_layers
from draftsmith.memory import check_memory
from draftsmith.progress import Progress
from draftsmith.runtime.engine import TargetEngine
from draftsmith.runtime.engine_choice import Engine, open_engine
from draftsmith.runtime.generic import HFEngine
from draftsmith.runtime.sampling import Sampling
from draftsmith.target import Target, default_device, embed_weight, load_target, load_tokenizer, text_config
from draftsmith.vllm_support import kv_bytes_per_token


def stop_ids(target: Target) -> set[int]:
    ids = {target.tokenizer.eos_token_id}
    gen = getattr(target.model, "generation_config", None)
    eos = getattr(gen, "eos_token_id", None)
    ids.update(eos if isinstance(eos, list) else [eos])
    return {int(i) for i in ids if i is not None}


def check_compatible(drafter: Any, target: Target, path: Path) -> None:
    cfg, info = drafter.config, target.info
    if cfg.vocab_size != info.vocab_size or cfg.target_hidden_size != info.hidden_size:
        raise UserError(
            f"drafter {path} was made for a target with vocab {cfg.vocab_size} and hidden size "
            f"{cfg.target_hidden_size}, but {info.name} has vocab {info.vocab_size} and hidden size {info.hidden_size}"
        )
    validate_layers(cfg.aux_layer_ids, info.num_layers, method_of(cfg).aux_count)


def own_shapes(drafter: Any, manifest: dict[str, Any], path: Path, shapes: list[Shape], cfg: EvalConfig) -> list[Shape]:
    """The shapes this drafter may draft: a method that drafts no tree refuses one, and a --depth
    (or --depth-max) past its method's limit (`Method.depth_limit`) or the depth it was trained
    for is refused; --depth auto / --tree auto try the shapes within that (--tree auto's default
    shapes also `tree_of_depth` of a drafter trained deeper, and only it when all are deeper)."""
    method = method_of(drafter)
    if cfg.stop_below is not None and method.one_forward:
        raise UserError(
            f"--stop-below: drafter {path} is a {method.title} drafter ({method.drafting}): one forward drafts the "
            "whole chain, so stopping early saves nothing; drop --stop-below"
        )
    if cfg.drafting == "tree" and not method.trees:
        raise UserError(
            f"drafter {path} is a {method.title} drafter ({method.drafting}): one forward drafts the whole chain, "
            "so there is no tree to search; drop --tree/--top-k/--total-tokens and evaluate it with --mode chain"
        )
    trained = trained_depth(manifest)
    most = deepest(drafter.config, trained)
    if cfg.depth == "auto" and cfg.depth_max is None:  # as deep as it was trained (a drafter that does not say: 7)
        most = most or UNTRAINED_DEPTH_MAX
    if most is None:
        return shapes
    if cfg.tree == "auto":  # its shapes replace --depth; a deeper-trained drafter's own depth is tried too
        if cfg.tree_shapes is None and most > max(s.depth for s in shapes):
            shapes = [*shapes, tree_of_depth(most)]
    elif cfg.depth != "auto":
        check_depth(drafter.config, int(cfg.depth), trained=trained)
    elif cfg.depth_max is not None:
        check_depth(drafter.config, cfg.depth_max, "--depth-max", trained)
    return [s for s in shapes if s.depth <= most] or [tree_of_depth(most) if cfg.tree == "auto" else Shape(most)]


def make_proposer(
    engine: Engine, drafter: Any, cfg: EvalConfig, sampling: Sampling, max_len: int, shape: Shape
) -> StagedCycle:
    """The drafter's method's proposer (`PROPOSERS`) of `shape` (a chain or a tree); with
    `cfg.compile`, CUDA graphs for plain decoding (1 token), verification (draft size + 1 tokens)
    and a tree's KV compaction on the fast engine, and for the drafter's whole side of a cycle
    (greedy or sampled)."""
    mode = "chain" if shape.top_k is None else "tree"
    make = PROPOSERS[method_of(drafter).name]
    proposer = make(drafter, sampling, max_len, shape, bool(cfg.compile_drafter), cfg.batch_size)
    t0, had = time.perf_counter(), len(getattr(engine, "row_graphs", ()))
    if cfg.compile and isinstance(engine, TargetEngine):  # the generic engine has no graphs
        widths = range(2, proposer.size + 2) if shape.stop_below is not None else [proposer.size + 1]  # 1 + drafts
        for t in (1, *widths):
            engine.graph_rows(t)  # counts its own capture time
        if mode == "tree":
            engine.graph_compact(proposer.path_len)
    if cfg.compile:
        t1 = time.perf_counter()
        proposer.graph()
        engine.capture_seconds += time.perf_counter() - t1
    # on GPU, compiling and capturing takes long enough to say so
    if cfg.compile and getattr(proposer, "graphed", False):
        new_widths = len(getattr(engine, "row_graphs", ())) - had
        print(graphs_line(shape, time.perf_counter() - t0, new_widths, proposer.compiled), flush=True)
    return proposer


def graphs_line(shape: Shape, seconds: float, new_widths: int, compiled: bool) -> str:
    """The line each proposer's CUDA graphs print once ready: a GPU run's minutes before its first
    token go to these (the target's forward compiled per verification width, the drafter's side)."""
    target = f"the target's forward for {new_widths} new width{'s' * (new_widths != 1)}, " if new_widths else ""
    return (
        f"eval: {shape.label}: graphs ready in {seconds:.1f} s "
        f"({target}the drafter's {'compiled' if compiled else 'eager'} side)"
    )


def answer(
    tokenizer: Any,
    questions: list[Question],
    generators: list[Callable[[list[list[int]]], list[Turn]]],
    completion: bool = False,
    chunk: int = 1,
) -> list[list[list[Turn]]]:
    """Answer every turn of every question with each `generate(prompts) -> turns`, each with its
    own earlier answers in the history (raw text with `completion`). The generators take turns
    `chunk` questions at a time (the engine's batch): turn i of the first chunk by each of them,
    then of the next chunk, so that a machine whose speed drifts during the run (a shared CPU)
    slows each of them alike, and their ratio stays side by side. Returns, per generator, the
    turns of each question."""
    out: list[list[list[Turn]]] = [[[] for _ in questions] for _ in generators]
    texts: list[list[list[str]]] = [[[] for _ in questions] for _ in generators]
    for i in range(max(len(q.turns) for q in questions)):
        asked = [j for j, q in enumerate(questions) if len(q.turns) > i]
        for c in range(0, len(asked), chunk):
            part = asked[c : c + chunk]
            for g, generate in enumerate(generators):
                prompts = [turn_prompt(tokenizer, questions[j].turns[: i + 1], texts[g][j], completion) for j in part]
                for j, turn in zip(part, generate(prompts), strict=True):
                    out[g][j].append(turn)
                    texts[g][j].append(tokenizer.decode(turn.tokens, skip_special_tokens=True))
    return out


@dataclass
class Entrant:
    """A drafter of the run (--drafter, or one of --compare): its path and name in the comparison,
    the drafter (fitted to the target once it is loaded) with its manifest, and the draft shapes
    it may run."""

    path: Path
    name: str
    drafter: Any  # a METHODS module
    manifest: dict[str, Any]
    shapes: list[Shape]

    @property
    def method(self) -> str:
        return method_of(self.drafter).name


@dataclass
class Drafting:
    """An entrant's side of the run: the proposer of its draft shape (with the calibration that
    chose it, if any) and its own speculative sampler."""

    entrant: Entrant
    proposer: StagedCycle
    shape: Shape
    calibration: Calibration | None
    picks: list[int] | None  # the calibration's questions
    sampling: Sampling


@dataclass
class Decoding:
    """What a run decodes with: the engine, each entrant's drafting, the plain pass's sampler, a
    fresh sampler with the run's seed, and the token bounds."""

    engine: Engine
    draftings: list[Drafting]
    plain_sampling: Sampling
    sampler: Callable[[], Sampling]
    stops: set[int]
    max_new: int
    max_len: int


def with_device_defaults(cfg: EvalConfig, on_gpu: bool) -> EvalConfig:
    """The GPU defaults resolved (CUDA graphs, the drafter and the target compiled, the target's
    projections fused), so that run.yaml records them as such."""
    unset = [k for k in ("compile", "compile_drafter", "compile_target", "fuse_target") if getattr(cfg, k) is None]
    cfg = cfg.model_copy(update={k: on_gpu for k in unset})
    if cfg.compile and not on_gpu:
        raise UserError("--compile needs a CUDA device (CUDA graphs); drop it on CPU")
    return cfg


def resolve_questions(cfg: EvalConfig, on_gpu: bool) -> list[Question]:
    """The question set: `--bench`'s file or the bundled set, or a training run's held-out
    prompts (as many as MT-bench has, unless told; with --compare, every drafter's run must
    have held out the same ones); a few on CPU."""
    limit = cfg.num_questions or (None if on_gpu else 4)
    if cfg.bench != HELD_OUT:
        return load_questions(cfg.bench, limit)
    tok = load_tokenizer(cfg.target, cfg.chat_template)
    questions = held_out_questions(Path(cfg.drafter), tok, limit or 80)
    for other in cfg.compare:
        if held_out_questions(Path(other), tok, limit or 80) != questions:
            raise UserError(
                f"--bench {HELD_OUT}: the training runs of {cfg.drafter} and {other} held out different prompts (another "
                "dataset or split), so one's held-out questions may be the other's training data; compare them on a "
                "--bench both have not seen, or evaluate each on its own held-out split"
            )
    return questions


# --depth auto without --depth-max: chains up to the depth each drafter was trained for, or up to
# UNTRAINED_DEPTH_MAX for a drafter whose record does not say; none deeper than AUTO_DEPTH_CEILING
UNTRAINED_DEPTH_MAX, AUTO_DEPTH_CEILING = 7, 16


# --tree auto's shapes without --tree-shapes (each TOTALxDEPTHxTOPK); `tree_of_depth` adds one for a
# drafter trained deeper than the deepest of them, and stands in for them all for one trained shallower
DEFAULT_TREE_SHAPES = ("8x4x2", "16x5x4", "32x6x8", "60x7x10")


def tree_of_depth(depth: int) -> Shape:
    """--tree auto's tree for a drafter trained `depth` deep: 10 children a node and 10 tokens a
    level, as 60x7x10 has about."""
    return Shape(depth, 10, 10 * depth)


def candidate_shapes(cfg: EvalConfig) -> list[Shape]:
    """The draft shapes to run: the one asked for, or those `--depth auto` / `--tree auto` calibrate."""
    if cfg.tree == "auto":
        return [Shape.parse_tree(t) for t in cfg.tree_shapes or DEFAULT_TREE_SHAPES]
    if cfg.depth == "auto":  # K_max first: its acceptance serves every K; each drafter keeps its own (`own_shapes`)
        return [Shape(k) for k in range(cfg.depth_max or AUTO_DEPTH_CEILING, 0, -1)]
    if cfg.drafting == "tree":
        return [Shape(int(cfg.depth), cfg.top_k, cfg.total_tokens)]
    return [Shape(int(cfg.depth), stop_below=cfg.stop_below)]  # a float here: auto came with --depth auto


def fit_to_target(drafter: Any, manifest: dict[str, Any], target: Target, path: Path) -> None:
    """Check the drafter against the target, give it the target's embeddings where it was saved
    without them (speculators, as engines do), and cast it to the target's dtype."""
    check_compatible(drafter, target, path)
    if manifest.get("meta", {}).get("needs_target_embeddings"):
        drafter.load_target_embeddings(embed_weight(target.model).detach().float())
    drafter.to(dtype=target.dtype)


def entrant_names(paths: list[Path]) -> list[str]:
    """Distinct short names for the run's drafters: the last part of each path, or as many of its
    last parts as tell them apart (runs/a/drafter and runs/b/drafter: a-drafter, b-drafter)."""
    parts = [p.resolve().parts for p in paths]
    for k in range(1, max(map(len, parts)) + 1):
        names = ["-".join(q[-k:]) for q in parts]
        if len(set(names)) == len(names):
            return names
    return [str(i) for i in range(len(paths))]  # unreachable: the config refuses a drafter given twice


def load_entrants(cfg: EvalConfig, device: torch.device, shapes: list[Shape]) -> list[Entrant]:
    """The run's drafters (--drafter, then each --compare), each with the shapes it may draft;
    refused before anything is written where a drafter cannot draft the mode asked for, or where
    they read different target layers (one engine captures one set of layers for all)."""
    entrants = []
    for path, name in zip(cfg.drafters, entrant_names(cfg.drafters), strict=True):
        drafter, manifest = load_drafter(path, device)
        entrants.append(Entrant(Path(path), name, drafter, manifest, own_shapes(drafter, manifest, path, shapes, cfg)))
    layers = {e.path: e.drafter.config.aux_layer_ids for e in entrants}
    if len({tuple(ids) for ids in layers.values()}) > 1:
        raise UserError(
            "--compare: the drafters read different target layers ("
            + "; ".join(f"{p}: {ids}" for p, ids in layers.items())
            + "), and one engine captures one set of layers for all of them; evaluate them in separate runs"
        )
    return entrants


def check_decoding_memory(target: Target, batch: int, max_len: int, verify_tokens: int) -> None:
    """Refuse, before the engine allocates, a run whose decoding would not fit in the device's free
    memory: the target's KV cache of `batch` rows of `max_len` slots and a verification forward's
    float32 logits over `verify_tokens` tokens a row (with their working copies: the argmax or
    the probabilities), which a wide tree makes the larger part."""
    tc = text_config(target.model.config)
    cache = kv_bytes_per_token(tc, target.dtype.itemsize) * batch * max_len
    logits = 3 * batch * verify_tokens * int(tc.vocab_size) * 4
    check_memory(
        cache + logits,
        target.device,
        f"decoding {batch} row(s) with a KV cache of {max_len} slots and verifications of {verify_tokens} tokens",
        "lower --total-tokens or --top-k (a tree's verification), --batch-size, or --max-new-tokens",
    )


def open_decoding(
    cfg: EvalConfig, target: Target, entrants: list[Entrant], questions: list[Question], max_new: int
) -> Decoding:
    """The engine with a KV cache long enough for every turn and every entrant's draft, and each
    entrant's proposer of the shape asked for or, with `--depth auto` / `--tree auto`, of the one
    a calibration of its own picks."""
    tok, stops = target.tokenizer, stop_ids(target)
    bound = max(token_bound(tok, q, max_new, cfg.completion) for q in questions)
    size_bound = max(max(s.depth, s.total_tokens or 0) for e in entrants for s in e.shapes)
    max_len = 64 * math.ceil((bound + size_bound + 8) / 64)

    def sampler() -> Sampling:
        return Sampling(temperature=cfg.temperature, top_p=cfg.top_p, seed=cfg.seed)

    check_decoding_memory(target, cfg.batch_size, max_len, size_bound + 1)
    aux_layer_ids = entrants[0].drafter.config.aux_layer_ids  # every entrant's (load_entrants)
    engine = open_engine(
        target.model, aux_layer_ids, max_len, cfg.drafting, cfg.batch_size, cfg.compile_target, cfg.fuse_target
    )
    draftings = []
    for e in entrants:
        spec_sampling = sampler()

        def proposer_of(shape: Shape, e: Entrant = e, spec_sampling: Sampling = spec_sampling) -> StagedCycle:
            return make_proposer(engine, e.drafter, cfg, spec_sampling, max_len, shape)

        calibration, picks, shape = None, None, e.shapes[0]
        if cfg.depth == "auto" or cfg.tree == "auto":
            picks = spread(len(questions), cfg.calibration_questions)
            prompts = [turn_prompt(tok, questions[i].turns[:1], [], cfg.completion) for i in picks]
            calibration = calibrate(engine, proposer_of, prompts, max_new, stops, sampler, e.shapes)
            if cfg.stop_below == "auto":  # the adaptive chain at the threshold the measured costs give, measured too
                calibration = with_adaptive(
                    calibration,
                    lambda shape: decode_all(engine, prompts, max_new, stops, sampler(), proposer_of(shape)),
                )
            shape = calibration.best().shape
            print((f"{e.name}: " if cfg.compare else "") + shape_summary(calibration), flush=True)
        draftings.append(Drafting(e, proposer_of(shape), shape, calibration, picks, spec_sampling))
    return Decoding(engine, draftings, sampler(), sampler, stops, max_new, max_len)


def warm_up(d: Decoding, tok: Any, questions: list[Question], cfg: EvalConfig) -> float:
    """First-call allocations and kernel selection, speculative (each entrant) and plain, off the
    clock; the seconds it took."""
    t0 = time.perf_counter()
    warm = [turn_prompt(tok, questions[0].turns[:1], [], cfg.completion)] * cfg.batch_size
    for drafting in d.draftings:
        decode(d.engine, warm, 8, d.stops, d.sampler(), drafting.proposer)
    decode(d.engine, warm, 8, d.stops, d.sampler())
    return time.perf_counter() - t0


Turns = tuple[list[list[Turn]], list[list[Turn | None]], list[list[Turn | None]]]  # speculative, plain, wide


def answer_all(d: Decoding, tok: Any, questions: list[Question], cfg: EvalConfig, out: Path) -> list[Turns]:
    """Every question's turns, speculative by each entrant, plain (with `--speed`, timed) and
    plain through each verification forward's shape (with `--kernel-check`, greedy; one pass per
    distinct shape): they take turns, a batch of questions at a time. Per entrant, its
    speculative turns and the plain and wide turns it is compared with; where a pass did not
    run, its turns are None."""
    wide_sizes = (
        sorted({x.proposer.size + 1 for x in d.draftings}) if cfg.kernel_check and d.plain_sampling.greedy else []
    )
    passes = len(d.draftings) + cfg.speed + len(wide_sizes)
    with Progress("eval", out, total=passes * sum(len(q.turns) for q in questions), unit="turns") as progress:

        def answered(done: list[Turn]) -> None:
            progress.advance(len(done), tokens=sum(len(t.tokens) for t in done))

        def spec(drafting: Drafting) -> Callable[[list[list[int]]], list[Turn]]:
            return lambda prompts: decode_all(
                d.engine, prompts, d.max_new, d.stops, drafting.sampling, drafting.proposer, answered
            )

        def plain(prompts: list[list[int]]) -> list[Turn]:
            return decode_all(d.engine, prompts, d.max_new, d.stops, d.plain_sampling, None, answered)

        def plain_wide(size: int) -> Callable[[list[list[int]]], list[Turn]]:  # plain, through a verification's shape
            return lambda prompts: decode_all(d.engine, prompts, d.max_new, d.stops, d.sampler(), None, answered, size)

        generators = [*map(spec, d.draftings), *([plain] if cfg.speed else []), *map(plain_wide, wide_sizes)]
        answered_by = iter(answer(tok, questions, generators, cfg.completion, cfg.batch_size))  # `generators` order
        spec_turns = [next(answered_by) for _ in d.draftings]
        none: list[list[Turn | None]] = [[None] * len(t) for t in spec_turns[0]]
        plain_turns = next(answered_by) if cfg.speed else none
        wide_turns = dict(zip(wide_sizes, answered_by, strict=True))
    return [
        (s, plain_turns, wide_turns.get(x.proposer.size + 1, none))
        for s, x in zip(spec_turns, d.draftings, strict=True)
    ]


def turn_rows(
    tok: Any, questions: list[Question], turns: Turns, greedy: bool
) -> tuple[list[dict[str, Any]], list[str]]:
    """The report's rows, one per turn (its accepts; its tokens and seconds speculative and
    plain; whether they match under greedy decoding), and answers.jsonl's lines, one per question."""
    rows: list[dict[str, Any]] = []
    lines: list[str] = []
    for q, spec_q, plain_q, wide_q in zip(questions, *turns, strict=True):
        record = {"question_id": q.question_id, "category": q.category, "turns": [], "token_ids": [], "accepts": []}
        for n, (s, pt, wt) in enumerate(zip(spec_q, plain_q, wide_q, strict=True), start=1):
            row = {
                "category": q.category,
                "turn": n,
                "accepts": s.accepts,
                "drafted": s.drafted,
                "spec_tokens": len(s.tokens),
                "spec_seconds": s.seconds,
            }
            if pt is not None:
                row.update(
                    plain_tokens=len(pt.tokens),
                    plain_seconds=pt.seconds,
                    matches_plain=(s.tokens == pt.tokens) if greedy else None,
                )
                if wt is not None:
                    row.update(wide_matches_plain=wt.tokens == pt.tokens)
            rows.append(row)
            record["turns"].append(tok.decode(s.tokens, skip_special_tokens=True))
            record["token_ids"].append(s.tokens)
            record["accepts"].append(s.accepts)
        lines.append(json.dumps(record))
    return rows, lines


def report_meta(
    cfg: EvalConfig,
    d: Decoding,
    x: Drafting,
    target: Target,
    questions: list[Question],
    device: torch.device,
    warmup_s: float,
) -> ReportMeta:
    """report.json's description of one entrant's run: the shape, sampling, questions, target,
    drafter, device and engine, and the drafters it ran beside (wall_seconds is added at the end)."""
    on_gpu, engine, proposer, tree, e = device.type == "cuda", d.engine, x.proposer, cfg.drafting == "tree", x.entrant
    return ReportMeta(
        **options_meta(cfg),
        engine="draftsmith",
        mode=cfg.drafting,
        top_k=x.shape.top_k,
        stop_below=x.shape.stop_below,
        shape={**x.calibration.to_dict(), "questions": x.picks} if x.calibration is not None else None,
        total_tokens=proposer.size if tree else None,
        depth=x.shape.depth,
        questions=len(questions),
        max_new_tokens=d.max_new,
        target=target.info.name,
        target_info=target.info.to_dict(),
        drafter=str(e.path),
        drafter_meta=e.manifest.get("meta", {}),
        method=e.method,
        side_by_side_with=[str(y.entrant.path) for y in d.draftings if y is not x],
        aux_layer_ids=e.drafter.config.aux_layer_ids,
        device=torch.cuda.get_device_name(device) if on_gpu else "cpu",
        dtype=str(target.dtype).removeprefix("torch."),
        cuda_graphs=bool(cfg.compile),
        drafter_graphed=bool(cfg.compile) and proposer.graphed,
        drafter_compiled=proposer.compiled,
        tree_topk=("fused" if proposer.fused_topk else "torch") if tree else None,
        kv_cache_len=d.max_len,
        target_engine=engine.name,
        target_compiled=engine.compiled,
        target_fused=engine.fused,
        generic_engine_reason=engine.reason if isinstance(engine, HFEngine) else None,
        capture_seconds=round(engine.capture_seconds, 3),
        warmup_seconds=round(warmup_s, 3),
    )


def run(cfg: EvalConfig) -> Path:
    if cfg.engine == "vllm":  # the same figures, measured inside vLLM (evaluate/vllm_eval.py)
        from draftsmith.evaluate import vllm_eval

        return vllm_eval.run(cfg)
    t_start = time.perf_counter()
    device = torch.device(cfg.device) if cfg.device else default_device()
    on_gpu = device.type == "cuda"
    max_new = cfg.max_new_tokens or (256 if on_gpu else 48)
    questions = resolve_questions(cfg, on_gpu)
    cfg = with_device_defaults(cfg, on_gpu)
    cfg = cfg.model_copy(update={"batch_size": min(cfg.batch_size, max(len(questions), 1))})  # KV rows used
    check_template_options(cfg.chat_template, cfg.completion)
    torch.manual_seed(cfg.seed)
    entrants = load_entrants(cfg, device, candidate_shapes(cfg))
    inputs = [*cfg.drafters, cfg.target, cfg.bench, cfg.chat_template]
    with atomic_output_dir(cfg.out, "eval", inputs, cfg.overwrite) as out:
        write_run_record(out, cfg)
        target = load_target(cfg.target, device, cfg.dtype, cfg.chat_template)
        for e in entrants:
            fit_to_target(e.drafter, e.manifest, target, e.path)
        d = open_decoding(cfg, target, entrants, questions, max_new)
        warmup_s = warm_up(d, target.tokenizer, questions, cfg)
        answered = answer_all(d, target.tokenizer, questions, cfg, out)
        reports, places = [], [Path(), *(Path("compare") / x.entrant.name for x in d.draftings[1:])]
        for x, turns, place in zip(d.draftings, answered, places, strict=True):
            folder = out / place  # --drafter's report in OUT, as without --compare
            folder.mkdir(parents=True, exist_ok=True)
            rows, lines = turn_rows(target.tokenizer, questions, turns, x.sampling.greedy)
            atomic_write_text(folder / "answers.jsonl", "\n".join(lines) + "\n")
            meta = report_meta(cfg, d, x, target, questions, device, warmup_s)
            meta.wall_seconds = round(time.perf_counter() - t_start, 3)
            reports.append(build_report(rows, x.shape.depth, meta))
            write_report(reports[-1], folder)
        if cfg.compare:
            write_comparison([x.entrant.name for x in d.draftings], reports, out)
    for x, report, place in zip(d.draftings, reports, places, strict=True):
        print((f"{x.entrant.name}: " if cfg.compare else "") + summary_line(report, Path(cfg.out) / place), flush=True)
    if cfg.compare:
        print(f"eval: {len(reports)} drafters side by side -> {Path(cfg.out) / 'compare.md'}", flush=True)
    return Path(cfg.out)
