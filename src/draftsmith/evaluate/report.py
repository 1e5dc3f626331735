"""The eval report: numbers from the per-turn results, report.json, report.md, PNG plots.

tau                     tokens per target verification call over the whole run
                        (accepted drafts + 1, averaged over every verification step)
accept_per_position     P(draft position j accepted), j = 1..max depth, over all steps
accept_conditional      P(position j accepted | position j-1 accepted)
tau_distribution        {tokens per step: number of steps}
tau_by_turn             {turn number (1 = a question's first turn): tau over those turns}
tau_by_answer_half      {"first", "second": tau over the first / second half of each answer's
                        verification steps}: a target that repeats itself late in its answers
                        (small models do) lifts the second half, which a validation split of
                        other answers does not see
drafted_per_cycle       draft tokens verified per step, on average: the chain's length or the
                        tree's size, fewer for an adaptive chain (--stop-below); null for vLLM
speedup                 spec decode tok/s / plain decode tok/s (same engine, prompts, run,
                        batch size and temperature); null when no plain run was made

With `eval --compare`, compare.json / compare.md / compare.png put the drafters' reports side
by side: each one's tau and speed-up, overall and per category, against the one plain pass.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from draftsmith.evaluate.shape import Shape
from draftsmith.evaluate.vllm_profile import summary_line as vllm_profile_line
from draftsmith.fsutil import atomic_write_json, atomic_write_text


@dataclass
class ReportMeta:
    """report.json's description of a run, one schema for both engines: `draftsmith eval`
    (evaluate/run.py's `report_meta`) and `eval --engine vllm` (evaluate/vllm_eval.py) fill it, so
    their reports have the same keys. Fields without a default are what every run knows; those
    with one are an engine's own (None, or empty, where the other engine has no such thing)."""

    engine: str  # "draftsmith" or "vllm"
    mode: str  # chain or tree
    depth_requested: int | str  # --depth as given (a number, or "auto")
    tree_requested: str | None  # --tree as given
    top_k: int | None  # a tree's branching
    stop_below: float | None  # an adaptive chain's threshold (--stop-below, or the one auto chose)
    shape: dict[str, Any] | None  # the --depth auto / --tree auto calibration, with its questions
    total_tokens: int | None  # a tree's draft nodes per proposal
    depth: int  # the draft depth run: a chain's length, a tree's levels
    temperature: float
    top_p: float
    seed: int
    batch_size: int
    bench: str
    completion: bool
    questions: int
    max_new_tokens: int
    target: str  # the target as given
    target_info: dict[str, Any]  # its TargetInfo (name, layers, sizes, fingerprint)
    drafter: str  # the drafter folder as given
    drafter_meta: dict[str, Any]  # its drafter.json `meta` (how it was trained)
    method: str  # its method, a draft/methods.py METHODS name
    aux_layer_ids: list[int]  # the target layers it reads, in draftsmith's convention
    device: str
    dtype: str  # the target's
    cuda_graphs: bool
    target_engine: str  # the engine that ran the target (draftsmith's fast or generic engine, or vllm)
    capture_seconds: float  # CUDA-graph capture, off the clock
    warmup_seconds: float  # warm-up, off the clock
    side_by_side_with: list[str] = field(default_factory=list)  # --compare: the other drafters of the run
    drafter_graphed: bool | None = None  # draftsmith: the drafter's cycle ran in a CUDA graph
    drafter_compiled: bool | None = None  # draftsmith: the drafter step ran through torch.compile
    tree_topk: str | None = None  # draftsmith, trees: "fused" (two Triton kernels, fused_topk.py) or "torch"
    kv_cache_len: int | None = None  # draftsmith: the engine's KV cache length
    target_compiled: bool | None = None  # draftsmith: the target's forward ran through torch.compile
    target_fused: bool | None = None  # draftsmith: q/k/v and gate/up ran as one product each (on a GPU)
    generic_engine_reason: str | None = None  # draftsmith: why the generic HF engine ran the target
    vllm: dict[str, Any] | None = None  # vllm: its version, the folder it served, its engine args, passes
    wall_seconds: float | None = None  # the whole run, set when it ends

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def options_meta(cfg: Any) -> dict[str, Any]:
    """The ReportMeta fields that are an EvalConfig's options as given: the same in both engines."""
    return {
        "depth_requested": cfg.depth,
        "tree_requested": cfg.tree,
        "temperature": cfg.temperature,
        "top_p": cfg.top_p,
        "seed": cfg.seed,
        "batch_size": cfg.batch_size,
        "bench": cfg.bench,
        "completion": cfg.completion,
    }


def _rate(tokens: int, seconds: float) -> float | None:
    return round(tokens / seconds, 3) if seconds > 0 else None


def acceptance(accepts: list[int], depth: int) -> dict[str, Any]:
    calls = max(len(accepts), 1)  # target verification calls
    reached = [sum(a >= j for a in accepts) for j in range(depth + 1)]  # reached[0] = calls
    return {
        "tau": round(sum(a + 1 for a in accepts) / calls, 4),
        "steps": len(accepts),
        "accept_per_position": [round(reached[j] / calls, 4) for j in range(1, depth + 1)],
        "accept_conditional": [
            round(reached[j] / reached[j - 1], 4) if reached[j - 1] else None for j in range(1, depth + 1)
        ],
        "tau_distribution": {str(k): v for k, v in sorted(Counter(a + 1 for a in accepts).items())},
    }


def build_report(turns: list[dict[str, Any]], depth: int, meta: ReportMeta | dict[str, Any]) -> dict[str, Any]:
    """turns: one dict per answered turn with category, turn (1 = the question's first),
    accepts, spec_tokens, spec_seconds,
    and (when timed) plain_tokens, plain_seconds, matches_plain. `meta`: the run's `ReportMeta`
    (a plain dict where a test makes up its own)."""
    if isinstance(meta, ReportMeta):
        meta = meta.to_dict()
    all_accepts = [a for t in turns for a in t["accepts"]]
    timed = [t for t in turns if t.get("plain_seconds") is not None]

    def speed(rows: list[dict[str, Any]]) -> dict[str, Any]:
        spec_tok, spec_s = sum(t["spec_tokens"] for t in rows), sum(t["spec_seconds"] for t in rows)
        out = {
            "tokens": spec_tok,
            "spec_seconds": round(spec_s, 3),
            "spec_tok_per_s": _rate(spec_tok, spec_s),
            "plain_seconds": None,
            "plain_tok_per_s": None,
            "speedup": None,
        }
        rows_t = [t for t in rows if t.get("plain_seconds") is not None]
        if rows_t:
            plain_tok, plain_s = sum(t["plain_tokens"] for t in rows_t), sum(t["plain_seconds"] for t in rows_t)
            out.update(plain_seconds=round(plain_s, 3), plain_tok_per_s=_rate(plain_tok, plain_s))
            if out["spec_tok_per_s"] and out["plain_tok_per_s"]:
                out["speedup"] = round(out["spec_tok_per_s"] / out["plain_tok_per_s"], 4)
        return out

    by_cat: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for t in turns:
        by_cat[t["category"]].append(t)
    categories = {
        cat: {
            "turns": len(rows),
            **speed(rows),
            "tau": acceptance([a for t in rows for a in t["accepts"]], depth)["tau"],
        }
        for cat, rows in sorted(by_cat.items())
    }
    by_turn: dict[int, list[int]] = defaultdict(list)
    for t in turns:
        by_turn[t["turn"]] += t["accepts"]
    halves = {
        "first": [a for t in turns for a in t["accepts"][: len(t["accepts"]) // 2]],
        "second": [a for t in turns for a in t["accepts"][len(t["accepts"]) // 2 :]],
    }
    greedy_checked = [t["matches_plain"] for t in timed if t.get("matches_plain") is not None]
    wide_checked = [t["wide_matches_plain"] for t in timed if t.get("wide_matches_plain") is not None]
    drafted = [d for t in turns for d in t.get("drafted", [])]
    return {
        **acceptance(all_accepts, depth),
        "drafted_per_cycle": round(sum(drafted) / len(drafted), 4) if drafted else None,
        **speed(turns),
        "turns": len(turns),
        "greedy_turns_checked": len(greedy_checked),
        "greedy_turns_matching_plain": sum(greedy_checked),
        "verify_shape_turns_checked": len(
            wide_checked
        ),  # --kernel-check: plain decoding through the verification forward's shape
        "verify_shape_turns_matching_plain": sum(wide_checked),
        "categories": categories,
        "tau_by_turn": {str(n): acceptance(a, depth)["tau"] for n, a in sorted(by_turn.items())},
        "tau_by_answer_half": {half: acceptance(a, depth)["tau"] for half, a in halves.items()},
        **meta,
    }


def greedy_check_note(r: dict[str, Any]) -> str:
    """Why greedy turns may differ from plain decoding, for the report's greedy-check line: in
    fp32, draftsmith's engine matches every turn, so a differing one is a fault; in bf16 or fp16 a
    verification forward of several tokens rounds unlike one-token decoding, near-ties flip
    (`--kernel-check` counts the turns that the verification's shape alone changes)."""
    if r["greedy_turns_matching_plain"] == r["greedy_turns_checked"]:
        return ""
    if r.get("engine") == "vllm":
        return " (rounding: vLLM verifies several tokens in one forward, which rounds unlike one-token decoding)"
    if r["dtype"] == "float32":
        return " (in fp32 every turn should match: a differing one is a fault, please report it with this report)"
    if r.get("verify_shape_turns_checked"):
        return " (rounding: compare the kernel-shape check below)"
    return (
        f" ({r['dtype']} rounding: a verification forward of several tokens rounds unlike one-token decoding, "
        "and near-ties flip; `--kernel-check` measures how many turns that alone changes)"
    )


def fmt(v: float | None, spec: str = "{:.2f}") -> str:
    """A figure of report.md, or n/a where it was not measured."""
    return "n/a" if v is None else spec.format(v)


def vllm_pass_line(version: str, p: dict[str, Any]) -> str:
    """One pass of `eval --engine vllm` (`vllm_eval.pass_summary`) as a line of report.md."""
    c = p["counters"]
    return (
        f"- vLLM {version}, depth {p.get('depth')}, batch {p['batch_size']}: tau {p['tau']:.3f} ({p['steps']} steps; "
        f"from its counters {fmt(p['counters_tau'], '{:.3f}')}: {c['accepted']} accepted of {c['drafts']} drafts, "
        f"per position {c['accepted_per_pos']}), speculative {fmt(p['spec_tok_per_s'], '{:.1f}')} tok/s, "
        f"plain {fmt(p['plain_tok_per_s'], '{:.1f}')} tok/s, speed-up {fmt(p['speedup'], '{:.2f}x')}"
    )


def fastest_depths(r: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """`eval --engine vllm --sweep`: per batch size timed at more than one depth, its fastest pass
    (the depth to serve with there), keyed by batch size in the passes' order."""
    by_batch: dict[int, list[dict[str, Any]]] = {}
    for p in (r.get("vllm") or {}).get("passes", []):
        if p.get("speedup") is not None:
            by_batch.setdefault(p["batch_size"], []).append(p)
    return {b: max(ps, key=lambda p: p["speedup"]) for b, ps in by_batch.items() if len({p["depth"] for p in ps}) > 1}


def fastest_line(batch: int, p: dict[str, Any]) -> str:
    return f"vLLM's fastest at batch {batch}: K={p['depth']}, {p['speedup']:.2f}x (num_speculative_tokens {p['depth']})"


def markdown(r: dict[str, Any]) -> str:
    lines = [
        f"# draftsmith eval: {r['mode']} on {r['bench']}, engine {r.get('engine', 'draftsmith')}",
        "",
        f"- target `{r['target']}`, drafter `{r['drafter']}`, device {r['device']} ({r['dtype']}), CUDA graphs {r['cuda_graphs']}, "
        f"target engine {r.get('target_engine', 'fast')}"
        + "".join(
            f" ({w})" for w, on in (("compiled", r.get("target_compiled")), ("fused", r.get("target_fused"))) if on
        ),
        f"- {r['questions']} questions, {r['turns']} turns, {r['tokens']} tokens, temperature {r['temperature']}, "
        f"max {r['max_new_tokens']} new tokens per turn, batch size {r.get('batch_size', 1)} (each row its own question; "
        "plain decoding at the same batch size)",
        f"- **tau {r['tau']:.3f}** tokens per verification ({r['steps']} steps"
        + (f", {r['drafted_per_cycle']:.2f} drafted per step" if r.get("drafted_per_cycle") is not None else "")
        + "); by turn "
        + ", ".join(f"{n}: {tau:.2f}" for n, tau in r["tau_by_turn"].items())
        + f"; first / second half of each answer {r['tau_by_answer_half']['first']:.2f} / {r['tau_by_answer_half']['second']:.2f}",
        f"- decode: speculative {fmt(r['spec_tok_per_s'], '{:.1f}')} tok/s, plain {fmt(r['plain_tok_per_s'], '{:.1f}')} tok/s, "
        f"**speed-up {fmt(r['speedup'], '{:.2f}x')}**",
        f"- capture {r['capture_seconds']:.1f} s and warm-up {r['warmup_seconds']:.1f} s (not in decode time); wall {r['wall_seconds']:.1f} s",
    ]
    if r.get("vllm"):
        lines.append(
            "- vLLM engines started in "
            + ", ".join(f"{s:.1f} s ({name})" for name, s in r["vllm"]["start_seconds"].items())
            + " (not in decode time)"
        )
    for p in (r.get("vllm") or {}).get("passes", []):  # --engine vllm: each batch size, and vLLM's own counters
        lines.append(vllm_pass_line(r["vllm"]["version"], p))
    lines += [f"- **{fastest_line(b, p)}**" for b, p in fastest_depths(r).items()]
    for name, prof in ((r.get("vllm") or {}).get("profile") or {}).items():
        lines.append(vllm_profile_line(name, prof) if prof else f"- vLLM profile, {name}: no trace was written")
    if r.get("shape"):
        sh = r["shape"]
        adaptive = any(c.get("stop_below") is not None for c in sh["candidates"])
        flag = "--tree" if sh["mode"] == "tree" else "--stop-below" if adaptive else "--depth"
        lines.append(
            f"- `{flag} auto` chose **{sh['chosen']}** (predicted speed-up {sh['predicted_speedup']:.2f}x) from a "
            f"calibration of {sh['tokens']} tokens: "
            + ", ".join(
                f"{c['shape']} {c['expected_tokens']:.2f} tok/call, {c['cycle_ms']:.1f} ms/cycle, {c['predicted_speedup']:.2f}x"
                for c in sh["candidates"]
            )
            + (
                ""
                if r.get("speedup") is None
                else f"; the run at {sh['chosen']}: {r['speedup']:.2f}x at tau {r['tau']:.2f} (the calibration reads first "
                "turns only, so where second turns accept more its prediction is a floor)"
            )
        )
    if r["greedy_turns_checked"]:
        lines.append(
            f"- greedy check: {r['greedy_turns_matching_plain']}/{r['greedy_turns_checked']} turns identical to plain "
            f"decoding{greedy_check_note(r)}"
        )
    if r.get("verify_shape_turns_checked"):
        lines.append(
            f"- kernel-shape check: plain decoding through the verification forward's shape matches plain decoding in "
            f"{r['verify_shape_turns_matching_plain']}/{r['verify_shape_turns_checked']} turns (rounding of that shape alone)"
        )
    lines += ["", "| position | accepted | conditional |", "|---|---|---|"]
    for j, (a, c) in enumerate(zip(r["accept_per_position"], r["accept_conditional"], strict=True), start=1):
        lines.append(f"| {j} | {a:.3f} | {fmt(c, '{:.3f}')} |")
    lines += [
        "",
        "| category | turns | tokens | tau | spec tok/s | plain tok/s | speed-up |",
        "|---|---|---|---|---|---|---|",
    ]
    for cat, c in r["categories"].items():
        lines.append(
            f"| {cat} | {c['turns']} | {c['tokens']} | {fmt(c['tau'])} | {fmt(c['spec_tok_per_s'], '{:.1f}')} | "
            f"{fmt(c['plain_tok_per_s'], '{:.1f}')} | {fmt(c['speedup'], '{:.2f}x')} |"
        )
    lines += ["", "![acceptance per position](acceptance.png)", "", "![tau](tau.png)", ""]
    return "\n".join(lines)


def plot(r: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pos = list(range(1, len(r["accept_per_position"]) + 1))
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.bar(pos, r["accept_per_position"], label="accepted")
    ax.plot(
        pos,
        [c if c is not None else float("nan") for c in r["accept_conditional"]],
        "o-",
        color="C1",
        label="conditional",
    )
    ax.set(
        xlabel="draft position",
        ylabel="acceptance rate",
        ylim=(0, 1.05),
        title=f"acceptance per position (tau {r['tau']:.2f}, {r['mode']}, temperature {r['temperature']}, batch {r.get('batch_size', 1)})",
    )
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "acceptance.png", dpi=100)
    plt.close(fig)

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
    cats = list(r["categories"])
    a1.bar(cats, [r["categories"][c]["tau"] or 0.0 for c in cats])  # None: vLLM counted per call, not per turn
    a1.set(ylabel="tau", title="tau by category")
    a1.tick_params(axis="x", rotation=45)
    dist = r["tau_distribution"]
    a2.bar([int(k) for k in dist], list(dist.values()))
    a2.set(xlabel="tokens per verification step", ylabel="steps", title="tau distribution")
    fig.tight_layout()
    fig.savefig(out / "tau.png", dpi=100)
    plt.close(fig)


def write_report(r: dict[str, Any], out: Path) -> None:
    atomic_write_json(out / "report.json", r)
    atomic_write_text(out / "report.md", markdown(r))
    plot(r, out)


def summary_line(r: dict[str, Any], out: Path) -> str:
    speed = (
        f"speed-up {r['speedup']:.2f}x (spec {r['spec_tok_per_s']:.1f} tok/s, plain {r['plain_tok_per_s']:.1f} tok/s)"
        if r["speedup"] is not None
        else "no speed run"
    )
    if r["speedup"] is not None and r["speedup"] > 1.1 * r["tau"]:
        # a cycle verifies with at least one target forward and drafts besides: τ bounds the speed-up
        speed += (
            f" [noisy timing: a speed-up above tau {r['tau']:.2f} cannot come from the drafter; "
            "rerun on an otherwise idle machine]"
        )
    elif r["speedup"] is not None and r["speedup"] < 1:
        speed += f" [{slower_hint(r)}]"
    speed += "".join(f" [{fastest_line(b, p)}]" for b, p in fastest_depths(r).items())
    return f"eval: tau {r['tau']:.2f} ({r['mode']}), {speed}, {r['questions']} questions, {r['tokens']} tokens -> {out / 'report.json'}"


def slower_hint(r: dict[str, Any]) -> str:
    """What to try where speculative decoding ran slower than plain decoding: a shorter draft,
    which each engine finds its own way (a cycle's cost grows with the batch and the draft)."""
    batch = f" at batch {r['batch_size']}" if r.get("batch_size", 1) > 1 else ""
    if r.get("engine") == "vllm":
        return f"slower than plain decoding{batch}: measure shorter drafts with --sweep, e.g. --sweep 3:{r.get('batch_size', 1)}"
    if r.get("depth_requested") == "auto" or r.get("tree_requested") == "auto":
        return f"slower than plain decoding{batch}: the calibration's prediction missed; see report.md's shape section"
    return f"slower than plain decoding{batch}: --depth auto picks the draft from this machine's measured costs"


def shape_label(r: dict[str, Any]) -> str:
    """A report's draft shape: `chain K=7` (`chain K=7 stop<0.2` adaptive) or `tree 60x7x10` (TOTALxDEPTHxTOPK)."""
    tree = r["mode"] == "tree"
    shape = Shape(r["depth"], r["top_k"] if tree else None, r["total_tokens"] if tree else None, r.get("stop_below"))
    return f"{r['mode']} {shape.label}"


def comparison(names: list[str], reports: list[dict[str, Any]]) -> dict[str, Any]:
    """compare.json: the run's settings and, per drafter (`eval --compare`), its figures and
    where its report is (the first drafter's in the run's folder, the others' in compare/NAME)."""
    first = reports[0]
    return {
        **{k: first[k] for k in ("bench", "questions", "turns", "mode", "temperature", "batch_size", "max_new_tokens")},
        **{k: first[k] for k in ("target", "device", "dtype", "plain_tok_per_s")},
        "drafters": [
            {
                "name": name,
                "drafter": r["drafter"],
                "method": r["method"],
                "shape": shape_label(r),
                "report": "report.json" if i == 0 else f"compare/{name}/report.json",
                **{k: r[k] for k in ("tau", "spec_tok_per_s", "speedup", "accept_per_position")},
                **{k: r[k] for k in ("greedy_turns_checked", "greedy_turns_matching_plain")},
                "categories": {c: {"tau": v["tau"], "speedup": v["speedup"]} for c, v in r["categories"].items()},
            }
            for i, (name, r) in enumerate(zip(names, reports, strict=True))
        ],
    }


def comparison_markdown(c: dict[str, Any]) -> str:
    drafters = c["drafters"]
    lines = [
        f"# draftsmith eval: {len(drafters)} drafters side by side on {c['bench']}",
        "",
        f"- target `{c['target']}`, device {c['device']} ({c['dtype']}), {c['questions']} questions, {c['turns']} turns, "
        f"temperature {c['temperature']}, max {c['max_new_tokens']} new tokens per turn, batch size {c['batch_size']}",
        f"- one target engine and one plain-decoding pass ({fmt(c['plain_tok_per_s'], '{:.1f}')} tok/s) for all; the "
        "speculative passes and the plain one took turns a batch of questions at a time, so the speed-ups stand side by side",
        "",
        "| drafter | method | shape | tau | spec tok/s | speed-up | greedy check | report |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for d in drafters:
        check = f"{d['greedy_turns_matching_plain']}/{d['greedy_turns_checked']}" if d["greedy_turns_checked"] else "-"
        lines.append(
            f"| {d['name']} | {d['method']} | {d['shape']} | {d['tau']:.3f} | {fmt(d['spec_tok_per_s'], '{:.1f}')} | "
            f"{fmt(d['speedup'], '{:.2f}x')} | {check} | [{d['report']}]({d['report']}) |"
        )
    cats = list(drafters[0]["categories"])
    for key, title, spec in (("tau", "tau", "{:.2f}"), ("speedup", "speed-up", "{:.2f}x")):
        lines += ["", f"| {title} by category | " + " | ".join(d["name"] for d in drafters) + " |"]
        lines.append("|---" * (len(drafters) + 1) + "|")
        for cat in cats:
            lines.append(f"| {cat} | " + " | ".join(fmt(d["categories"][cat][key], spec) for d in drafters) + " |")
    lines += ["", "![side by side](compare.png)", ""]
    return "\n".join(lines)


def comparison_plot(c: dict[str, Any], out: Path) -> None:
    """compare.png: tau and (when timed) the speed-up per category, a bar per drafter."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    drafters, cats = c["drafters"], list(c["drafters"][0]["categories"])
    keys = [("tau", "tau")] + ([("speedup", "speed-up (x)")] if c["plain_tok_per_s"] else [])
    fig, axes = plt.subplots(1, len(keys), figsize=(6 * len(keys), 4), squeeze=False)
    width = 0.8 / len(drafters)
    for ax, (key, label) in zip(axes[0], keys, strict=True):
        for i, d in enumerate(drafters):
            values = [d["categories"][cat][key] or 0.0 for cat in cats]
            ax.bar([j + i * width for j in range(len(cats))], values, width, label=d["name"])
        ax.set_xticks([j + width * (len(drafters) - 1) / 2 for j in range(len(cats))], cats, rotation=45, ha="right")
        ax.set(ylabel=label, title=f"{label} by category ({Path(c['bench']).name}, batch {c['batch_size']})")
        if key == "speedup":
            ax.axhline(1.0, color="grey", lw=0.8)
    axes[0][0].legend()
    fig.tight_layout()
    fig.savefig(out / "compare.png", dpi=100)
    plt.close(fig)


def write_comparison(names: list[str], reports: list[dict[str, Any]], out: Path) -> None:
    c = comparison(names, reports)
    atomic_write_json(out / "compare.json", c)
    atomic_write_text(out / "compare.md", comparison_markdown(c))
    comparison_plot(c, out)
