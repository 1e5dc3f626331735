"""Which SGLang release serves which EAGLE-3 drafter, and the weight names only SGLang needs.

Read from `sglang/srt/models/llama_eagle3.py` in each release's PyPI wheel (0.5.10 to 0.5.23):

    release   its LlamaForCausalLMEagle3
    <= 0.5.11 one decoder layer (`midlayer`), fc straight on the aux states, the pre-norm output
              fed back; it loads fc_norm.*, input_norm.* and layers.{i}.* by skipping them silently
    0.5.12    `num_hidden_layers` layers (layer 0 from `midlayer.*`), per-aux `fc_norm.{i}`
              (config `fc_norm`), `norm_output` (upstream #24663)
    0.5.17    `norm_before_fc`: `input_norm` over the concatenated aux states (eagle_config first,
              then the top level), applied before fc_norm
    any       no `norm_before_residual`: the residual is always the un-normalised hidden state

A later layer (1..) in SGLang normalises its input with `hidden_norm` (fused with the residual
add) and builds an `input_layernorm` it never uses; vLLM's later layers do the opposite. Both are
the plain pre-norm Llama layer draftsmith trains, so an SGLang export writes the layer's input
norm under both names (`sglang_tensors`): each engine loads the copy it uses into its used norm
and the other into its unused one. No file I/O in this module.
"""

from __future__ import annotations

import re

import torch

from draftsmith.draft.layouts import arch_options
from draftsmith.draft.model import DrafterConfig
from draftsmith.errors import UserError

NEWEST_READ = "0.5.23"  # the newest release whose llama_eagle3.py the table below was read from
LAYERS = "num_layers"  # the feature "more than one decoder layer" (train --num-layers)
# the first release that serves each feature as draftsmith trains it; None: none up to NEWEST_READ
FIRST_RELEASE: dict[str, str | None] = {
    LAYERS: "0.5.12",
    "fc_norm": "0.5.12",
    "norm_output": "0.5.12",
    "norm_before_fc": "0.5.17",
    "norm_before_residual": None,
}
# what a release without the feature does instead (it loads such a drafter without error)
INSTEAD = {
    LAYERS: "builds one decoder layer and skips layers.{i}.* silently",
    "fc_norm": "skips fc_norm.*.weight silently and feeds the raw aux states to fc",
    "norm_output": "feeds the pre-norm layer output to the next draft step",
    "norm_before_fc": "skips input_norm.weight silently and feeds the raw aux states to fc",
    "norm_before_residual": "always uses the un-normalised hidden state as the residual",
}


def release_tuple(release: str) -> tuple[int, int, int]:
    """'0.5.12.post1' -> (0, 5, 12); anything not of that form is a UserError."""
    m = re.fullmatch(r"v?(\d+)\.(\d+)\.(\d+)(\S*)", release.strip())
    if m is None:
        raise UserError(f"--sglang-release {release!r}: give an SGLang release such as {NEWEST_READ}")
    return int(m[1]), int(m[2]), int(m[3])


def features(cfg: DrafterConfig) -> list[str]:
    """The features of this drafter that SGLang must have, in FIRST_RELEASE's names."""
    used = [LAYERS] if cfg.num_layers > 1 else []
    return used + [name for name, on in arch_options(cfg).items() if on]


def _label(cfg: DrafterConfig, feature: str) -> str:
    return f"--num-layers {cfg.num_layers}" if feature == LAYERS else f"{feature}=true"


def minimum_release(cfg: DrafterConfig) -> str | None:
    """The first SGLang release that serves this drafter as trained; None when any release does
    (a drafter that no release serves is `refusal`'s business)."""
    firsts = [FIRST_RELEASE[f] for f in features(cfg) if FIRST_RELEASE[f] is not None]
    return max(firsts, key=release_tuple) if firsts else None


def refusal(cfg: DrafterConfig, release: str | None) -> str | None:
    """Why SGLang (`release`, or the newest read when None) would serve this drafter wrongly (it
    loads it without error), or None when it serves it as trained."""
    used = features(cfg)
    never = [f for f in used if FIRST_RELEASE[f] is None]
    vllm = "export with --engine vllm (--format eagle or speculators), whose llama_eagle3 serves it"
    if never:
        instead = "; ".join(f"for {f} it {INSTEAD[f]}" for f in never)
        return (
            f"this drafter was trained with {', '.join(_label(cfg, f) for f in never)}, which no SGLang release "
            f"serves (read up to {NEWEST_READ}): its LlamaForCausalLMEagle3 has no such option ({instead}), so it "
            f"would serve this drafter wrongly. {vllm[0].upper()}{vllm[1:]}, or retrain with `train --for-engine sglang`"
        )
    if release is None:
        return None
    have = release_tuple(release)
    lacks = [f for f in used if release_tuple(str(FIRST_RELEASE[f])) > have]
    if not lacks:
        return None
    what = "; ".join(f"{_label(cfg, f)}, served from SGLang {FIRST_RELEASE[f]} (it {INSTEAD[f]})" for f in lacks)
    return (
        f"SGLang {release} cannot serve this drafter: it lacks {what}. Serve it with SGLang {minimum_release(cfg)} "
        f"or newer (--sglang-release), or {vllm}, or retrain with `train --for-engine sglang` for SGLang {release}"
    )


def sglang_tensors(tensors: dict[str, torch.Tensor], num_layers: int) -> dict[str, torch.Tensor]:
    """An export's tensors for SGLang: each later layer's input norm also as `layers.{i}.hidden_norm.weight`,
    the norm SGLang's later layers use (see the module docstring)."""
    extra = {  # copies: safetensors refuses two names for one storage
        f"layers.{i}.hidden_norm.weight": tensors[f"layers.{i}.input_layernorm.weight"].clone()
        for i in range(1, num_layers)
    }
    return {**tensors, **extra}
