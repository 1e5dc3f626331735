"""The command registry: each single-stage command, its typed config and its `run(cfg)`.

    cli -> commands -> stage packages -> core        (pipeline -> commands as well)

`cli` builds one subcommand per entry (and adds `pipeline` and `quickstart`, which run entries
of this table in one process). Configs are imported here directly (they are light); each run
function imports its stage when the command runs, so `draftsmith --help` loads no stage.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from draftsmith.config import CommandConfig
from draftsmith.data.config import PrepareConfig, VocabConfig
from draftsmith.evaluate.config import EvalConfig
from draftsmith.export.config import ExportConfig
from draftsmith.extract.config import ExtractConfig
from draftsmith.plan.config import PlanConfig
from draftsmith.status import StatusConfig
from draftsmith.synth.config import SynthConfig
from draftsmith.train.config import TrainConfig


@dataclass(frozen=True)
class Command:
    config: type[CommandConfig]
    run: Callable[[Any], Path]
    help: str


def synth(cfg: SynthConfig) -> Path:
    from draftsmith.synth.run import run

    return run(cfg)


def prepare(cfg: PrepareConfig) -> Path:
    from draftsmith.data.prepare import run

    return run(cfg)


def vocab(cfg: VocabConfig) -> Path:
    from draftsmith.data.vocab import run

    return run(cfg)


def extract(cfg: ExtractConfig) -> Path:
    from draftsmith.extract.run import run

    return run(cfg)


def train(cfg: TrainConfig) -> Path:
    from draftsmith.train.run import run

    return run(cfg)


def export(cfg: ExportConfig) -> Path:
    from draftsmith.export.run import run

    return run(cfg)


def evaluate(cfg: EvalConfig) -> Path:
    from draftsmith.evaluate.run import run

    return run(cfg)


def plan(cfg: PlanConfig) -> Path:
    from draftsmith.plan.run import run

    return run(cfg)


def status(cfg: StatusConfig) -> Path:
    from draftsmith.status import run

    return run(cfg)


COMMANDS: dict[str, Command] = {
    "synth": Command(SynthConfig, synth, "Generate on-policy conversations answered by the target itself."),
    "prepare": Command(
        PrepareConfig, prepare, "Tokenize conversations with the target's chat template and assistant-only loss masks."
    ),
    "vocab": Command(
        VocabConfig, vocab, "Build the draft vocabulary (d2t offsets, t2d mask) from a tokenized dataset."
    ),
    "extract": Command(ExtractConfig, extract, "Capture the target's hidden states into a store on disk."),
    "train": Command(
        TrainConfig, train, "Train an EAGLE-3 drafter, offline from a store or online with the target in the loop."
    ),
    "export": Command(ExportConfig, export, "Export a drafter for vLLM or SGLang."),
    "eval": Command(
        EvalConfig, evaluate, "Measure acceptance length and real speed-up with lossless speculative decoding."
    ),
    "plan": Command(PlanConfig, plan, "Estimate disk, memory and time for every stage, checked against free space."),
    "status": Command(
        StatusConfig, status, "Show progress, rate, ETA, errors and disk use of any stage's output folder."
    ),
}
# the commands a pipeline may list as stages (status only reads)
STAGES = tuple(name for name in COMMANDS if name != "status")
