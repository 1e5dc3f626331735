"""The model card (`README.md`) written into every exported folder.

It says what the drafter is for (target), its architecture options, how it was trained (the
drafter manifest's `meta`), on what data (`meta["data_mix"]`, for a drafter trained on a
`synth --mix` output: its sources, licenses and counts), which target layers it reads in every
convention, what it measured (an eval `report.json`, if given), and how to serve it with vLLM
and SGLang (or why SGLang cannot). Pure string building; no I/O.
"""

from __future__ import annotations

import json
from typing import Any

from draftsmith.draft.layouts import arch_options
from draftsmith.draft.model import DrafterConfig
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


def _eval_section(report: dict[str, Any]) -> list[str]:
    lines = ["## Measured acceptance", ""]
    tau = report.get("tau")
    lines.append(f"- acceptance length τ (tokens per target call): **{tau:.3f}**" if isinstance(tau, int | float)
                 else f"- acceptance length τ: {tau}")
    per_pos = report.get("accept_per_position") or []
    if per_pos:
        lines.append("- acceptance per draft position: " + ", ".join(f"{p:.3f}" for p in per_pos))
    speedup = report.get("speedup")
    lines.append(f"- decode speed-up over plain decoding: {speedup:.2f}x" if isinstance(speedup, int | float)
                 else "- decode speed-up: not measured")
    return [*lines, ""]


def _data_section(mix: dict[str, Any]) -> list[str]:
    """The training data of a `synth --mix` run: its sources, licenses and conversation counts."""
    lines = ["## Training data", "",
             f"Conversations answered by the target itself (`draftsmith synth --mix {mix.get('mix')}`, "
             f"selection seed {mix.get('seed')}): {mix.get('conversations')} in all.", "",
             "| source | license | conversations | notes |", "|---|---|---|---|"]
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
        lines += ["", "`config.json` states each one (`norm_before_fc` also in `eagle_config`), and the weights "
                  "`input_norm.weight` / `fc_norm.{i}.weight` carry vLLM's and speculators' names. Serve with a "
                  "vLLM whose `llama_eagle3` has `input_norm`, `fc_norm` and `norm_output` (older ones refuse "
                  "those weights and ignore `norm_output`). SGLang's `LlamaForCausalLMEagle3` has none of them."]
    return [*lines, ""]


def _serving(folder_hint: str, target_name: str, fmt: str, engine: str, k: int, sglang_ok: bool) -> list[str]:
    spec = json.dumps({"method": "eagle3", "model": folder_hint, "num_speculative_tokens": k})
    lines = ["## Serving", ""]
    if engine == "vllm":
        lines += ["vLLM:", "", "```bash", f"vllm serve {target_name} --speculative-config '{spec}'", "```", ""]
        if fmt == "speculators":
            lines += ["or, with the verifier named in `speculators_config`:", "", "```bash",
                      f"vllm serve {folder_hint}", "```", ""]
    if fmt == "eagle" and not sglang_ok:
        lines += ["SGLang cannot serve this drafter: its `LlamaForCausalLMEagle3` lacks the architecture "
                  "options above and would load it without error but serve it wrongly.", ""]
    elif fmt == "eagle":
        note = ("" if engine == "sglang" else
                " (this export's `eagle_config` ids are in vLLM's convention: re-export with "
                "`--engine sglang` for SGLang)")
        lines += [f"SGLang{note}:", "", "```bash",
                  f"python -m sglang.launch_server --model-path {target_name} --speculative-algorithm EAGLE3 \\",
                  f"    --speculative-draft-model-path {folder_hint} --speculative-num-steps {k} \\",
                  f"    --speculative-eagle-topk 1 --speculative-num-draft-tokens {k + 1}", "```", ""]
        if engine == "sglang":
            lines += ["vLLM reads the top-level `eagle_aux_hidden_state_layer_ids` (written in its own "
                      "convention), so this folder also serves correctly with:", "", "```bash",
                      f"vllm serve {target_name} --speculative-config '{spec}'", "```", ""]
    return lines


def model_card(
    cfg: DrafterConfig,
    manifest: dict[str, Any],
    fmt: str,
    engine: str,
    folder_hint: str,
    speculative_tokens: int,
    report: dict[str, Any] | None,
) -> str:
    target = manifest.get("target") or {}
    target_name = str(target.get("name") or "TARGET")
    lines = [
        f"# EAGLE-3 drafter for {target_name}",
        "",
        f"Exported by draftsmith as `--format {fmt}` for **{engine}**. One decoder layer, hidden size "
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
    lines += ["## Training", ""] + (_scalar_lines({k: v for k, v in meta.items() if k != "data_mix"})
                                    or ["- no training metadata was recorded"]) + [""]
    if meta.get("data_mix"):
        lines += _data_section(meta["data_mix"])
    if report is not None:
        lines += _eval_section(report)
    sglang_ok = not any(arch_options(cfg).values())
    lines += _serving(folder_hint, target_name, fmt, engine, speculative_tokens, sglang_ok)
    return "\n".join(lines)
