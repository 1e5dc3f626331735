"""Config of `draftsmith train`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from draftsmith.config import CommandConfig, ShardOption, TargetOptions
from draftsmith.draft.shape import DrafterShape
from draftsmith.draft.step_weights import STEP_DECAY

# the drafter options SGLang's LlamaForCausalLMEagle3 reads only from 0.5.12 or 0.5.17, or never (export/sglang.py)
SGLANG_UNSERVED = ("norm_before_fc", "fc_norm", "norm_output", "norm_before_residual")
# EAGLE-3's architecture options, which a DFlash drafter (draft/dflash.py) does not have
EAGLE3_OPTIONS = SGLANG_UNSERVED
# the options of TTT's unroll (train/ttt.py, train/loss.py), through which EAGLE-3 and P-EAGLE train
TTT_OPTIONS = ("attention", "compile_step", "ttt_positions", "loss", "lk_eta", "aux_noise")
PEAGLE_STEP_DECAY = 1.0  # P-EAGLE weighs every depth alike


class TrainConfig(CommandConfig, TargetOptions, ShardOption, DrafterShape):
    """Defaults are the ones the ablations on the H200 recipe's data chose (docs/train.md, "Why
    these defaults", names each run); the drafter's vocab size, MLP width and depth come from
    `DrafterShape`."""

    positional = "dataset_dir"
    common = (
        *("dataset_dir", "target", "out", "hidden", "vocab", "depth", "steps", "epochs", "lr", "batch_tokens"),
        *("grad_accum", "max_len", "val_fraction", "val_every", "save_every", "seed", "resume", "overwrite"),
        *("device", "dtype", "shard", "for_engine", "draft_vocab_size", "intermediate_size", "num_layers", "method"),
    )
    panels = {
        "EAGLE-3 and P-EAGLE options (TTT and the EAGLE-3 layer; DFlash refuses them)": TTT_OPTIONS + EAGLE3_OPTIONS
    }
    renamed = {"layers": "aux_layer_ids", "ttt": "depth"}  # one name per concept across commands and files
    dataset_dir: Path = Field(description="Tokenized dataset folder from `draftsmith prepare`.")
    out: Path = Field(description="Output folder for checkpoints, metrics and plots.")
    hidden: Path | None = Field(
        None, description="Hidden-state store from `extract` (offline mode); omit to train online."
    )
    partial_store: bool = Field(
        False,
        description="Train on a --hidden store that is incomplete or still being written, on the samples it holds now.",
    )
    vocab: Path | None = Field(
        None, description="Draft vocab file from `draftsmith vocab`; default: built from the dataset."
    )
    aux_layer_ids: list[int] | None = Field(None, description="Aux layer ids (online mode); default [2, L//2, L-3].")
    depth: int = Field(7, ge=1, description="Draft depth trained for: the training-time-test unroll steps.")
    steps: int | None = Field(None, gt=0, description="Optimizer steps (overrides --epochs).")
    epochs: float = Field(1.0, gt=0, le=10_000, description="Epochs over the training split.")
    lr: float = Field(2e-3, gt=0, description="Peak learning rate.")
    optimizer: Literal["adamw", "muon"] = Field(
        "muon",
        description="adamw, or muon (Muon on the hidden weight matrices at AdamW's update RMS, AdamW on norms and lm_head).",
    )
    schedule: Literal["cosine", "linear", "constant"] = Field(
        "cosine", description="Learning-rate decay after the warm-up."
    )
    warmup_ratio: float = Field(0.03, ge=0, lt=1, description="Fraction of steps for linear warm-up.")
    weight_decay: float = Field(0.0, ge=0, description="Weight decay.")
    step_decay: float | None = Field(
        None,
        gt=0,
        le=1,
        description=f"Loss weight of TTT step k (DFlash: slot k+1) is step_decay**k; default {STEP_DECAY}, "
        f"--method peagle {PEAGLE_STEP_DECAY}.",
    )
    loss: Literal["ce", "tv", "lk"] = Field(
        "ce",
        description="Training objective: ce (soft cross-entropy), tv (total variation) or lk (the LK blend); docs/train.md.",
    )
    lk_eta: float = Field(3.0, ge=0, description="--loss lk: η of the blend weight λ = exp(-η·acceptance).")
    loss_tokens: Literal["answers", "all"] = Field(
        "answers",
        description="Positions trained on: the answers (prepare's loss mask), or every token, the prompt's too (docs/train.md).",
    )
    ttt_positions: Literal["all", "reached"] = Field(
        "all",
        description="Positions TTT step k trains on: every valid one, or only those a greedy chain of drafts reaches (docs/train.md).",
    )
    teacher_temperature: float = Field(
        1.0,
        gt=0,
        description="Training only: divide the target's logits by this before the softmax the drafter learns (below 1: sharper).",
    )
    aux_noise: float = Field(
        0.0,
        ge=0,
        description="Training only: Gaussian noise of this many RMS on the aux states, a regulariser for small datasets (0: none).",
    )
    norm_before_fc: bool = Field(
        False,
        description="One RMSNorm over the concatenated aux states before fc (served as `input_norm`); then --fc-norm is off unless given.",
    )
    fc_norm: bool | None = Field(
        None,
        description="EAGLE-3.1: one RMSNorm per aux layer before fc (served as `fc_norm.{i}`); default: on, unless --norm-before-fc is given.",
    )
    norm_output: bool = Field(True, description="Feed norm(out) instead of out to the next TTT / draft step.")
    norm_before_residual: bool = Field(
        False, description="The drafter layer's residual is hidden_norm(h) instead of h."
    )
    head_init: Literal["random", "target"] = Field(
        "target",
        description="lm_head and final norm: random, or copied from the target (its lm_head rows of the draft vocab, its final norm).",
    )
    freeze_head: bool = Field(
        False, description="Keep lm_head and the final norm fixed (with --head-init target: the target's own)."
    )
    grad_clip: float = Field(0.5, gt=0, description="Gradient-norm clip.")
    batch_tokens: int = Field(
        8192,
        gt=0,
        description="Tokens per packed row (one micro-batch); samples are packed end to end, longer ones truncated.",
    )
    grad_accum: int = Field(1, ge=1, description="Micro-batches per optimizer step.")
    max_len: int = Field(
        2048, gt=0, description="Samples longer than this (or than --batch-tokens) are truncated to it."
    )
    val_fraction: float = Field(
        0.05,
        ge=0,
        lt=1,
        description="Fraction of samples held out for validation (0: validate on the training samples).",
    )
    val_every: int | None = Field(
        None, ge=1, description="Validate every N steps instead of at the end of every epoch (and always at the end)."
    )
    log_every: int = Field(10, ge=1, description="Log metrics every N steps.")
    save_every: int = Field(200, ge=1, description="Checkpoint every N steps.")
    keep_checkpoints: int = Field(2, ge=1, description="How many of the newest checkpoints to keep.")
    attention: Literal["auto", "eager", "flex"] = Field(
        "auto",
        description="TTT attention: flex (compiled flex_attention, O(T) memory; GPU), eager (explicit scores; CPU); auto picks flex on GPU.",
    )
    capture_attention: Literal["auto", "dense", "flex"] = Field(
        "auto",
        description="Online mode: the target's attention in a packed row: dense (sdpa), flex (skips other samples; CUDA), or auto.",
    )
    compile_capture: bool = Field(
        False,
        description="Online mode: the target's packed capture forward compiled (torch.compile, one width); fewer host launches.",
    )
    loss_chunk: int = Field(4096, gt=0, description="Tokens per chunk of the vocab-sized loss computation.")
    compile_step: bool | None = Field(
        None,
        description="The drafter's static-shape step, compiled with torch.compile on CUDA (docs/train.md); default on for GPU.",
    )
    seed: int = Field(0, description="Random seed: the drafter's initialisation and the order of the training rows.")
    val_seed: int = Field(
        0,
        description="Seed of the train/validation split, apart from --seed, so that runs of several seeds hold out the same samples.",
    )
    resume: bool = Field(False, description="Continue the run in --out from its last checkpoint.")
    autocast: bool | None = Field(None, description="bf16 autocast for the drafter; default on for GPU.")
    distributed: Literal["ddp", "fsdp"] = Field(
        "ddp", description="Strategy under torchrun (WORLD_SIZE > 1): DDP, or FSDP2 (fully_shard)."
    )
    overwrite: bool = Field(False, description="Replace an existing output folder (without --resume).")
    for_engine: Literal["vllm", "sglang"] = Field(
        "vllm",
        description="The engine that will serve it: vllm (every option), or sglang before 0.5.12 (one layer, no norm options).",
    )
    method: Literal["eagle3", "peagle", "dflash"] = Field(
        "eagle3",
        description="The drafter: eagle3, peagle (all drafts in one forward) or dflash (a block drafter); docs/train.md.",
    )
    anchors: int | Literal["all"] | None = Field(
        None,
        description="--method dflash: blocks per row and step, drawn at random, or all answer positions; default "
        "batch-tokens/(depth+1).",
    )
    train_embedding: bool = Field(
        False,
        description="Train the drafter's token embedding (from the target's) instead of keeping the target's; export writes it.",
    )
    paper_settings: bool = Field(
        False,
        description="--method peagle or dflash: options not given take the values of the method's paper (docs/train.md).",
    )

    @field_validator("anchors", mode="before")
    @classmethod
    def _anchors(cls, v: Any) -> int | str | None:
        """A positive count (an int, or its digits), or "all"."""
        if v is None or v == "all":
            return v
        if (
            isinstance(v, int)
            and not isinstance(v, bool)
            and v > 0
            or isinstance(v, str)
            and v.isdigit()
            and int(v) > 0
        ):
            return int(v)
        raise ValueError(f"{v!r}: give a number of anchors per row (512) or all")

    @field_validator("lr")
    @classmethod
    def _lr_in_range(cls, lr: float) -> float:
        """AdamW's first step divides the rate by 1 - beta1 and Muon's scales it by up to ~50: past
        ~1e36 that overflows fp32 inside torch's optimizer step, a traceback instead of the
        diverged run the trainer names (a rate of 1e30 still diverges into that clear error)."""
        if lr > 1e30:
            raise ValueError(f"{lr:g} is above 1e30, where the optimizer's step overflows fp32; give a rate like 2e-3")
        return lr

    @model_validator(mode="after")
    def _compile_capture_online_on_one_device(self) -> TrainConfig:
        """--compile-capture compiles online training's capture on one device: refused, before the
        target loads, where nothing is captured (--hidden) or the target is split over GPUs."""
        if self.compile_capture and (self.hidden is not None or self.shard != "none"):
            why = "a store's states are read, not captured (--hidden)" if self.hidden else "--shard splits the target"
            raise ValueError(f"--compile-capture compiles online training's capture on one device, and {why}")
        return self

    @model_validator(mode="before")
    @classmethod
    def _method_options(cls, data: Any) -> Any:
        """The options given, completed by the method's paper's values where --paper-settings asks
        (`MethodOptions.paper`: given options win), then checked and completed by --method's
        validator (`METHOD_OPTIONS`)."""
        if not isinstance(data, dict) or data.get("method", "eagle3") not in METHOD_OPTIONS:
            return data  # (the field's Literal names the methods)
        method = METHOD_OPTIONS[data.get("method", "eagle3")]
        if data.get("paper_settings"):
            if not method.paper:
                raise ValueError(
                    "--paper-settings: EAGLE-3's defaults are draftsmith's own measured recipe (docs/train.md, "
                    '"Why these defaults"); the paper settings are for --method peagle and dflash'
                )
            data = {**method.paper, **data}
        return method.check(data)

    @model_validator(mode="after")
    def _method_defaults(self) -> TrainConfig:
        """--method's defaults of the options every method reads, where none was given: set as
        defaults (not marked given), so that --resume reads the run's own from its run.yaml."""
        for name, value in METHOD_OPTIONS[self.method].defaults.items():
            if getattr(self, name) is None:
                object.__setattr__(self, name, value)
        return self


def eagle3_options(data: dict[str, Any]) -> dict[str, Any]:
    """--method eagle3: --for-engine sglang turns off what SGLang cannot serve (refusing it where
    asked for); then fc_norm not given: the per-layer norm, unless norm_before_fc asks for the
    other one (each engine serves one aux-state norm; export refuses a drafter with both)."""
    no_anchors(data)
    if data.get("for_engine") == "sglang":
        asked = [f"--{k.replace('_', '-')}" for k in SGLANG_UNSERVED if data.get(k)]
        if int(data.get("num_layers") or 1) > 1:
            asked.append(f"--num-layers {data['num_layers']}")
        if asked:
            raise ValueError(
                f"--for-engine sglang trains the drafter SGLang's LlamaForCausalLMEagle3 serves: "
                f"one decoder layer, none of {', '.join(SGLANG_UNSERVED)}; drop {', '.join(asked)}"
            )
        data = {**data, **dict.fromkeys(SGLANG_UNSERVED, False), "num_layers": 1}
    if data.get("fc_norm") is None:
        data = {**data, "fc_norm": not data.get("norm_before_fc", False)}
    return data


def peagle_options(data: dict[str, Any]) -> dict[str, Any]:
    """--method peagle: EAGLE-3's options, served by vLLM only."""
    if data.get("for_engine") == "sglang":
        raise ValueError(
            "--method peagle with --for-engine sglang: SGLang does not serve P-EAGLE (parallel drafting); "
            "vLLM does (llama_eagle3 with parallel_drafting). Use --for-engine vllm, or --method eagle3"
        )
    return eagle3_options(data)


def no_anchors(data: dict[str, Any]) -> None:
    """--anchors places DFlash's blocks: refused for the methods that train through TTT's unroll."""
    if data.get("anchors") is not None:
        raise ValueError(
            f"--anchors places DFlash's blocks; --method {data.get('method', 'eagle3')} trains every position "
            "through TTT's unroll: drop --anchors"
        )


def dflash_options(data: dict[str, Any]) -> dict[str, Any]:
    """--method dflash: refuse what a block drafter has no use for, naming it, and turn EAGLE-3's
    architecture options off (a DFlash drafter has none of them)."""
    asked = [f"--{k.replace('_', '-')}" for k in EAGLE3_OPTIONS if data.get(k)]
    reasons = {
        "for_engine": (
            "sglang",
            "SGLang's DFlash is not an export target of draftsmith (export --engine vllm serves it)",
        ),
        "ttt_positions": ("reached", "a block is drafted in one forward: every slot sees the same context"),
        "compile_step": (True, "the DFlash step has no static, compiled form yet"),
        "attention": ("flex", "the DFlash step attends through SDPA with an explicit block mask"),
    }
    why = [f"--{k.replace('_', '-')} {v}: {reason}" for k, (v, reason) in reasons.items() if data.get(k) == v]
    if data.get("aux_noise"):
        why.append("--aux-noise: not implemented for DFlash")
    if data.get("loss", "ce") != "ce":
        why.append(f"--loss {data['loss']}: the DFlash block objective is the soft cross-entropy only")
    if asked:
        why.append(f"{', '.join(asked)}: EAGLE-3 architecture options, which a DFlash drafter does not have")
    if why:
        raise ValueError("--method dflash refuses " + "; ".join(why))
    return {**data, **dict.fromkeys(EAGLE3_OPTIONS, False)}


@dataclass(frozen=True)
class MethodOptions:
    """A method's part of `train`'s options: its validator (`check`: the options given -> the
    options it trains with; a ValueError names what it refuses), its defaults of the options
    every method reads (shown in their --help line), and, for --paper-settings, the values of its
    paper's reference training (`paper`; `paper_layers`: how many target layers it reads, spread
    as the reference spreads them, `paper_aux_layers`)."""

    check: Callable[[dict[str, Any]], dict[str, Any]]
    defaults: dict[str, Any]
    paper: dict[str, Any] = field(default_factory=dict)
    paper_layers: int | None = None


# P-EAGLE (AWS's published drafters): four layers, the embedding trained, AdamW. DFlash (z-lab's
# reference and SpecForge's DFlash example): every answer position anchored each pass, five layers
# fed from five target layers, AdamW at 6e-4 with 4 % warm-up and a gradient clip of 1.0.
METHOD_OPTIONS = {
    "eagle3": MethodOptions(eagle3_options, {"step_decay": STEP_DECAY}),
    "peagle": MethodOptions(
        peagle_options,
        {"step_decay": PEAGLE_STEP_DECAY},
        {"num_layers": 4, "train_embedding": True, "optimizer": "adamw", "lr": 1e-4},
    ),
    "dflash": MethodOptions(
        dflash_options,
        {"step_decay": STEP_DECAY},
        {"anchors": "all", "num_layers": 5, "optimizer": "adamw", "lr": 6e-4, "warmup_ratio": 0.04, "grad_clip": 1.0},
        paper_layers=5,
    ),
}


def paper_aux_layers(num_layers: int, count: int) -> list[int]:
    """DFlash's reference spread of `count` target layers over a target of `num_layers`: evenly
    from the output of layer 1 to that of layer L-3 (its `build_target_layer_ids`, which counts
    layer outputs), in draftsmith's convention (the stream entering a layer: one more)."""
    if count == 1:
        return [num_layers // 2 + 1]
    start, end = 1, num_layers - 3
    return [round(start + i * (end - start) / (count - 1)) + 1 for i in range(count)]


def requested_layers(cfg: TrainConfig, num_layers: int) -> list[int] | None:
    """The aux layers a run asks for on a target of `num_layers`: --aux-layer-ids, else under
    --paper-settings its paper's spread (`MethodOptions.paper_layers`), else None (every command's
    default)."""
    count = METHOD_OPTIONS[cfg.method].paper_layers
    paper = paper_aux_layers(num_layers, count) if cfg.paper_settings and count else None
    return cfg.aux_layer_ids or paper
