"""Config of `draftsmith eval`."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from draftsmith.config import CommandConfig, TargetOptions


def tree_pool(depth: int, top_k: int) -> int:
    """The draft nodes an EAGLE-2 tree `depth` levels deep with `top_k` chooses its --total-tokens from:
    top_k at the first level, then top_k children of each of the top_k frontier nodes at every further one."""
    return top_k + (depth - 1) * top_k * top_k


def oversized_tree(total: int, depth: int, top_k: int) -> str | None:
    """Why a tree of `total` draft tokens, `depth` deep with `top_k`, cannot be drafted (None: it can):
    the one check of --total-tokens and of each --tree-shapes entry."""
    pool = tree_pool(depth, top_k)
    if total <= pool:
        return None
    return f"a tree {depth} deep with top-k {top_k} drafts {pool} nodes to choose from, fewer than {total}"


class EvalConfig(CommandConfig, TargetOptions):
    common = (
        *("engine", "target", "drafter", "compare", "out", "bench", "mode", "depth", "tree", "top_k", "total_tokens"),
        *("batch_size", "temperature", "num_questions", "max_new_tokens", "speed", "device", "dtype", "overwrite"),
    )
    renamed = {"k": "depth", "k_max": "depth_max"}  # one name for the draft depth across commands and files
    engine: Literal["draftsmith", "vllm"] = Field(
        "draftsmith",
        description="Engine that decodes: draftsmith's own, or vLLM serving the exported drafter (chains; the vllm extra; docs/eval.md).",
    )
    drafter: Path = Field(
        description="Drafter: a train output folder (its drafter/), or an exported or third-party drafter folder."
    )
    compare: list[Path] = Field(
        [],
        description="More drafters run side by side with --drafter, against one plain pass (docs/eval.md, Side by side).",
    )
    out: Path = Field(description="Output folder for report.json, report.md, plots and answers.jsonl.")
    chat_template: Path | None = Field(
        None, description="Jinja chat template file to use instead of the tokenizer's own (a base model has none)."
    )
    completion: bool = Field(
        False,
        description="Completion mode for base models: raw prompts without a chat template, as `prepare --completion` tokenizes.",
    )
    bench: str = Field(
        "mt_bench",
        description="Question set: mt_bench (bundled), held-out (validation prompts of the run that trained --drafter), or a JSONL file.",
    )
    mode: Literal["chain", "tree"] = Field("chain", description="Drafting mode.")
    depth: int | Literal["auto"] = Field(
        7,
        description="Draft depth: the chain's length, or the tree's levels; 'auto' (chain): the best predicted of 1..--depth-max.",
    )
    depth_max: int | None = Field(
        None, ge=1, description="--depth auto: the longest chain considered; default the trained depth (else 7)."
    )
    stop_below: float | Literal["auto"] | None = Field(
        None,
        description="Chain: stop drafting when no row's confidence in its draft reaches this (0-1; --depth: the most); auto: measured.",
    )
    tree: Literal["auto"] | None = Field(
        None,
        description="auto: tree mode, in the shape of --tree-shapes with the best predicted speed; replaces --depth, --top-k, --total-tokens.",
    )
    tree_shapes: list[str] | None = Field(
        None,
        description="--tree auto: shapes TOTALxDEPTHxTOPK; default 8x4x2,16x5x4,32x6x8,60x7x10 and, trained D deep, (10·D)xDx10.",
    )
    calibration_questions: int = Field(
        2,
        ge=1,
        description="--depth auto / --tree auto: calibrate on the first turns of this many questions, spread over the run's.",
    )
    top_k: int = Field(10, ge=1, description="Tree mode: children expanded per node.")
    total_tokens: int = Field(
        60, ge=1, description="Tree mode: the tree's size, the draft tokens verified per cycle over all its levels."
    )
    batch_size: int = Field(
        1,
        ge=1,
        description="Questions decoded at once, one per row, and plain decoding alike; above 1 needs the fast engine.",
    )
    temperature: float = Field(0.0, ge=0, description="0 for greedy; >0 for lossless speculative sampling.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling for temperature > 0.")
    num_questions: int | None = Field(
        None, gt=0, description="Use the first N questions; default all on GPU, 4 on CPU."
    )
    max_new_tokens: int | None = Field(None, gt=0, description="Tokens per turn; default 256 on GPU, 48 on CPU.")
    speed: bool = Field(True, description="Also time plain decoding with the same engine for the speed-up.")
    kernel_check: bool = Field(
        False,
        description="Greedy: also decode plainly through the verification forward's shape, to tell bf16 rounding from real differences.",
    )
    seed: int = Field(0, description="Random seed.")
    compile: bool | None = Field(
        None, description="CUDA graphs for target verification and plain decoding alike; default on for GPU."
    )
    compile_drafter: bool | None = Field(
        None,
        description="torch.compile the drafter step inside its CUDA graph; default on for GPU; the eager step if compiling fails.",
    )
    compile_target: bool | None = Field(
        None,
        description="torch.compile the target's forward inside its CUDA graphs; default on for GPU; the eager one if compiling fails.",
    )
    fuse_target: bool | None = Field(
        None,
        description="The target's q/k/v and gate/up as one product each, as vLLM runs them; default on for GPU (docs/eval.md).",
    )
    sweep: list[str] = Field(
        [],
        description="--engine vllm: more DEPTH:BATCH passes in the same run (such as 3:1,7:64), each timed against plain decoding.",
    )
    vllm_profile: int = Field(
        0,
        ge=0,
        description="--engine vllm: trace up to N steps of each engine, untimed, and report where a step's time goes by phase.",
    )
    overwrite: bool = Field(False, description="Replace an existing output folder.")

    @field_validator("sweep")
    @classmethod
    def _sweep(cls, v: list[str]) -> list[str]:
        for item in v:
            depth, _, batch = item.partition(":")
            if not (depth.isdigit() and batch.isdigit() and int(depth) >= 1 and int(batch) >= 1):
                raise ValueError(f"{item!r}: each pass is DEPTH:BATCH, two whole numbers >= 1, such as 7:16")
        return v

    @field_validator("stop_below")
    @classmethod
    def _probability(cls, v: float | str | None) -> float | str | None:
        if isinstance(v, float) and not 0 < v < 1:
            raise ValueError(
                f"{v:g} is not a probability strictly between 0 and 1: the chain would never stop (<= 0) or never go "
                "past its first draft (>= 1); try 0.1-0.5, or 'auto'"
            )
        return v

    @model_validator(mode="before")
    @classmethod
    def _stop_below_auto(cls, values: Any) -> Any:
        """--stop-below auto calibrates the chains as --depth auto does (and bounds them as it does)."""
        if isinstance(values, dict) and values.get("stop_below") == "auto":
            if values.get("depth", "auto") != "auto":
                raise ValueError(
                    "--stop-below auto chooses the longest chain too: drop --depth (bound it with --depth-max)"
                )
            values = {**values, "depth": "auto"}
        return values

    @field_validator("depth")
    @classmethod
    def _positive(cls, v: int | str) -> int | str:
        if isinstance(v, int) and v < 1:
            raise ValueError("must be >= 1 or 'auto'")
        return v

    @property
    def drafters(self) -> list[Path]:
        """The run's drafters: --drafter, then each --compare."""
        return [self.drafter, *self.compare]

    @property
    def drafting(self) -> str:
        """The drafting mode this run uses: --mode, or tree with --tree auto."""
        return "tree" if self.tree == "auto" else self.mode

    @model_validator(mode="after")
    def _compare(self) -> EvalConfig:
        if self.sweep and self.engine != "vllm":
            raise ValueError("--sweep times extra passes inside vLLM: add --engine vllm, or drop --sweep")
        if self.vllm_profile and self.engine != "vllm":
            raise ValueError(
                "--vllm-profile traces vLLM's engine: add --engine vllm; draftsmith's own cycle is profiled by "
                "bench/eval_bench.py --parts cycle --profile DIR"
            )
        if self.compare and self.engine == "vllm":
            raise ValueError(
                "--compare runs the drafters side by side in draftsmith's engine; vLLM serves one drafter per server: "
                "drop --engine vllm, or run one eval per drafter"
            )
        seen = [p.resolve() for p in self.drafters]
        if len(set(seen)) < len(seen):
            raise ValueError(
                f"a drafter is given twice in --drafter and --compare ({', '.join(map(str, self.drafters))})"
            )
        return self

    @model_validator(mode="after")
    def _tree_auto(self) -> EvalConfig:
        if self.tree == "auto":
            if "mode" in self.model_fields_set and self.mode != "tree":
                raise ValueError("--tree auto drafts trees; drop --mode chain (or use --depth auto for a chain)")
            if self.depth == "auto":
                raise ValueError("--tree auto chooses the depth too; drop --depth auto")
        elif self.depth == "auto" and self.mode == "tree":
            raise ValueError("--depth auto chooses a chain length; for a tree shape use --tree auto")
        return self

    @model_validator(mode="after")
    def _tree_size(self) -> EvalConfig:
        """An explicit --total-tokens larger than the tree can draft is refused (the default's 60 is cut to it)."""
        if (
            self.drafting == "tree"
            and self.tree is None
            and self.depth != "auto"
            and "total_tokens" in self.model_fields_set
        ):
            why = oversized_tree(self.total_tokens, self.depth, self.top_k)
            if why is not None:
                raise ValueError(
                    f"--total-tokens {self.total_tokens}: {why}; give --total-tokens "
                    f"{tree_pool(self.depth, self.top_k)} or less, or a larger --depth or --top-k"
                )
        return self

    @model_validator(mode="after")
    def _adaptive(self) -> EvalConfig:
        if self.stop_below is None:
            return self
        if self.drafting == "tree":
            raise ValueError(
                "--stop-below stops a chain; a tree already keeps only its most confident nodes (EAGLE-2's "
                "dynamic tree, --total-tokens of them): drop --stop-below, or draft a chain"
            )
        if self.engine == "vllm":
            raise ValueError("--stop-below: vLLM drafts a fixed number of tokens a step; drop it with --engine vllm")
        if self.depth == "auto" and self.stop_below != "auto":
            raise ValueError(
                "--depth auto picks a fixed chain; with --stop-below P give the longest chain as --depth N, or let "
                "--stop-below auto choose both"
            )
        return self
