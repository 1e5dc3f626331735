"""The model card (`README.md`) written into every exported folder.

It says what the drafter is for (target), its architecture options, how it was trained (the
drafter manifest's `meta`), on what data (`meta["data_mix"]`, for a drafter trained on a
`synth --mix` output: its sources, licenses and counts), which target layers it reads in every
convention, what it measured (an eval `report.json`, if given), and how to serve it with vLLM
and SGLang (or why SGLang cannot), in the draft shape that the eval measured (`serving_shape`):
its chain length, or its tree for SGLang, whose EAGLE-2 tree takes the same three numbers.
Pure string building; no I/O.
"""

from __future__ import annotations

import json
from typing import Any

from draftsmith.draft.layouts import arch_options
from draftsmith.draft.methods import method_of
from draftsmith.draft.model import DrafterConfig
from draftsmith.export import sglang
from draftsmith.layers import to_engine

CONVENTIONS = (
    ("draftsmith", "residual stream entering decoder layer k (HF `output_hidden_states[k]`)"),
    ("vllm", "the same as draftsmith: vLLM captures the input of layer k"),
    ("sglang", "output of layer i; SGLang adds 1 internally (also SpecForge and ModelOpt)"),
)


def _scalar_lines(meta: dict[str, Any]) -> list[str]:
    """One bullet per short meta entry; nested values as compact JSON, long ones left out."""
    lines = []
    for key, value in meta.items():
        text = value if isinstance(value, str) else json.dumps(value, default=str)
        if len(text) <= 200:
            lines.append(f"- `{key}`: {text}")
    return lines


def serving_shape(report: dict[str, Any] | None) -> dict[str, Any] | None:
    """The draft shape an eval report measured: mode, depth, and for a tree top_k and
    total_tokens; None without a report or for one that does not say (older reports)."""
    if not report or report.get("mode") not in ("chain", "tree") or not isinstance(report.get("depth"), int):
        return None
    shape = {"mode": report["mode"], "depth": report["depth"]}
    if report["mode"] == "tree":
        if not isinstance(report.get("top_k"), int) or not isinstance(report.get("total_tokens"), int):
            return None
        shape.update(top_k=report["top_k"], total_tokens=report["total_tokens"])
    return shape


def _shape_lines(report: dict[str, Any], shape: dict[str, Any]) -> list[str]:
    """What the eval measured with which shape, and how the shape was chosen."""
    name = (
        f"a chain of {shape['depth']}"
        if shape["mode"] == "chain"
        else f"an EAGLE-2 tree of {shape['total_tokens']} tokens, depth {shape['depth']}, top-k {shape['top_k']}"
    )
    where = ", ".join(str(report[k]) for k in ("bench", "device", "dtype") if report.get(k))
    lines = [
        f"- draft shape measured: {name}" + (f" ({where}, temperature {report.get('temperature', 0)})" if where else "")
    ]
    auto = report.get("shape")
    if isinstance(auto, dict) and auto.get("candidates"):
        lines.append(
            f"- chosen by `{'--depth' if shape['mode'] == 'chain' else '--tree'} auto` from "
            + ", ".join(f"{c['shape']} ({c['predicted_speedup']:.2f}x)" for c in auto["candidates"])
            + " predicted on a short calibration"
        )
    return lines


def _eval_section(report: dict[str, Any]) -> list[str]:
    lines = ["## Measured acceptance", ""]
    tau = report.get("tau")
    lines.append(
        f"- acceptance length τ (tokens per target call): **{tau:.3f}**"
        if isinstance(tau, int | float)
        else f"- acceptance length τ: {tau}"
    )
    per_pos = report.get("accept_per_position") or []
    if per_pos:
        lines.append("- acceptance per draft position: " + ", ".join(f"{p:.3f}" for p in per_pos))
    speedup = report.get("speedup")
    lines.append(
        f"- decode speed-up over plain decoding: {speedup:.2f}x"
        if isinstance(speedup, int | float)
        else "- decode speed-up: not measured"
    )
    shape = serving_shape(report)
    if shape is not None:
        lines += _shape_lines(report, shape)
        lines.append(
            f"- measured on draftsmith's own static-KV engine at batch size {report.get('batch_size') or 1}, "
            "against plain decoding on the same engine; a serving engine's speed-up differs (measure it there)"
        )
    return [*lines, ""]


def _data_section(mix: dict[str, Any]) -> list[str]:
    """The training data of a `synth --mix` run: its sources, licenses and conversation counts."""
    lines = [
        "## Training data",
        "",
        f"Conversations answered by the target itself (`draftsmith synth --mix {mix.get('mix')}`, "
        f"selection seed {mix.get('seed')}): {mix.get('conversations')} in all.",
        "",
        "| source | license | conversations | notes |",
        "|---|---|---|---|",
    ]
    for s in mix.get("sources", []):
        note = f"left out (other licenses): {', '.join(s['left_out'])}" if s.get("left_out") else ""
        name = s["name"] if s["name"] == s["source"] else f"{s['name']} (`{s['source']}`)"
        lines.append(f"| {name} | {s['license']} | {s['conversations']} | {note} |")
    return [*lines, ""]


def _options_section(cfg: DrafterConfig) -> list[str]:
    options = arch_options(cfg)
    lines = ["## Architecture options", ""]
    lines += [f"- `{name}`: {str(on).lower()}" for name, on in options.items()]
    if any(options.values()):
        lines += [
            "",
            "`config.json` states each one (`norm_before_fc` also in `eagle_config`), and the weights "
            "`input_norm.weight` / `fc_norm.{i}.weight` carry vLLM's and speculators' names. Serve with a "
            "vLLM whose `llama_eagle3` has `input_norm`, `fc_norm` and `norm_output` (older ones refuse "
            "those weights and ignore `norm_output`). SGLang's `LlamaForCausalLMEagle3` reads `fc_norm` and "
            f"`norm_output` from {sglang.FIRST_RELEASE['fc_norm']}, `norm_before_fc` from "
            f"{sglang.FIRST_RELEASE['norm_before_fc']}, and never `norm_before_residual`.",
        ]
    return [*lines, ""]


def _sglang_shape(depth: int, tree: dict[str, Any] | None) -> str:
    """SGLang's draft flags: a chain of `depth` (top-k 1), or the measured tree (verified tokens + root)."""
    steps, top_k, tokens = (
        (depth, 1, depth + 1) if tree is None else (tree["depth"], tree["top_k"], tree["total_tokens"] + 1)
    )
    return f"--speculative-num-steps {steps} \\\n    --speculative-eagle-topk {top_k} --speculative-num-draft-tokens {tokens}"


def _serving(
    folder_hint: str,
    target_name: str,
    fmt: str,
    engine: str,
    depth: int,
    sglang_why: str | None,
    sglang_release: str | None,
    tree: dict[str, Any] | None,
    parallel: bool = False,
) -> list[str]:
    spec = json.dumps(
        {"method": "eagle3", "model": folder_hint, "num_speculative_tokens": depth}
        | ({"parallel_drafting": True} if parallel else {})
    )
    lines = ["## Serving", ""]
    if parallel:
        lines += [
            "A P-EAGLE drafter (parallel drafting): one drafter forward proposes all "
            f"{depth} drafts, which vLLM runs with `parallel_drafting` (the speculators layout sets it itself). "
            "SGLang has no parallel-drafting EAGLE and cannot serve it.",
            "",
        ]
    if tree is not None:
        lines += [
            f"The eval measured a tree: SGLang below drafts that tree; vLLM drafts a chain, here of {depth} "
            "(evaluate a chain, `draftsmith eval --depth auto`, for its best length).",
            "",
        ]
    if engine == "vllm":
        lines += ["vLLM:", "", "```bash", f"vllm serve {target_name} --speculative-config '{spec}'", "```", ""]
        if fmt == "speculators":
            lines += [
                "or, with the verifier named in `speculators_config`:",
                "",
                "```bash",
                f"vllm serve {folder_hint}",
                "```",
                "",
            ]
    if parallel:
        pass
    elif fmt == "eagle" and sglang_why is not None:
        lines += [f"SGLang cannot serve this drafter: {sglang_why}.", ""]
    elif fmt == "eagle":
        note = (
            ""
            if engine == "sglang"
            else " (this export's `eagle_config` ids are in vLLM's convention: re-export with "
            "`--engine sglang` for SGLang)"
        )
        lines += [
            f"SGLang {sglang_release} or newer{note}:"
            if sglang_release
            else f"SGLang (any release with EAGLE-3){note}:",
            "",
            "```bash",
            f"python -m sglang.launch_server --model-path {target_name} --speculative-algorithm EAGLE3 \\",
            f"    --speculative-draft-model-path {folder_hint} {_sglang_shape(depth, tree)}",
            "```",
            "",
        ]
        if engine == "sglang":
            lines += [
                "vLLM reads the top-level `eagle_aux_hidden_state_layer_ids` (written in its own "
                "convention), so this folder also serves correctly with:",
                "",
                "```bash",
                f"vllm serve {target_name} --speculative-config '{spec}'",
                "```",
                "",
            ]
    return lines


def model_card(
    cfg: DrafterConfig,
    manifest: dict[str, Any],
    fmt: str,
    engine: str,
    folder_hint: str,
    depth: int,
    report: dict[str, Any] | None,
    sglang_release: str | None = None,
) -> str:
    """`sglang_release`: the SGLang release the export was checked for (--sglang-release), or None
    for the first that serves the drafter."""
    target = manifest.get("target") or {}
    target_name = str(target.get("name") or "TARGET")
    lines = [
        f"# {method_of(cfg).title} drafter for {target_name}",
        "",
        f"Exported by draftsmith as `--format {fmt}` for **{engine}**. "
        f"{'One decoder layer' if cfg.num_layers == 1 else f'{cfg.num_layers} decoder layers'}, hidden size "
        f"{cfg.hidden_size}, draft vocabulary {cfg.draft_vocab_size} of {cfg.vocab_size} target tokens.",
        "",
        "## Target",
        "",
    ]
    lines += _scalar_lines({k: v for k, v in target.items() if k != "default_aux_layers"}) or ["- unknown"]
    lines += ["", *_options_section(cfg), "## Auxiliary layers", "", "| convention | ids | meaning |", "|---|---|---|"]
    lines += [f"| {name} | {to_engine(cfg.aux_layer_ids, name)} | {meaning} |" for name, meaning in CONVENTIONS]
    lines += ["", "`config.json` records the convention of each id field under `draftsmith.layer_id_conventions`.", ""]
    meta = manifest.get("meta") or {}
    lines += (
        ["## Training", ""]
        + (_scalar_lines({k: v for k, v in meta.items() if k != "data_mix"}) or ["- no training metadata was recorded"])
        + [""]
    )
    if meta.get("data_mix"):
        lines += _data_section(meta["data_mix"])
    if report is not None:
        lines += _eval_section(report)
    why, first = sglang.refusal(cfg, None), sglang.minimum_release(cfg)
    release = sglang_release if sglang_release is not None else first
    shape = serving_shape(report)
    tree = shape if shape is not None and shape["mode"] == "tree" else None
    lines += _serving(folder_hint, target_name, fmt, engine, depth, why, release, tree, method_of(cfg).one_forward)
    return "\n".join(lines)
