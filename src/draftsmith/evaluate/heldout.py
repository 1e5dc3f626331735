"""`--bench held-out`: the drafter's own validation split as an eval question set (issue 17).

The questions are the first user turns of the very samples that training held out, so eval
measures the drafter on its training distribution (why: docs/eval.md). The split is the run's
own: `--drafter` must be a `draftsmith train` output folder (or its `drafter/` inside), whose
run.yaml names the dataset, `--val-fraction` and `--val-seed` (runs from before `--val-seed`
split by `--seed`), and, for offline training, the store whose samples were split. A turn's text
is recovered from the sample's tokens: the template's text around one sentinel user message
(`data.chat.around_message`) must match the tokens before the sample's first answer token, the
user's words in place of the sentinel; samples whose prefix does not decode that way (another
template, a completion-mode sample) are counted and left out. `--num-questions N` takes N spread
evenly over the split, since `prepare` keeps its sources in the order they were synthesised.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from draftsmith.config import load_yaml_mapping
from draftsmith.data.chat import around_message
from draftsmith.data.dataset import TokenizedDataset, load_dataset, split_indices
from draftsmith.errors import UserError
from draftsmith.evaluate.questions import Question
from draftsmith.evaluate.shape import spread

HELD_OUT = "held-out"


def training_config(drafter: Path) -> dict[str, Any]:
    """The `config` of the run.yaml of the training run that made `drafter` (a train output
    folder, or its `drafter/`)."""
    for folder in (drafter, drafter.parent):
        record = folder / "run.yaml"
        if record.exists() and (folder / "drafter").is_dir():
            config = load_yaml_mapping(record, "training run record").get("config") or {}
            if isinstance(config, dict) and "dataset_dir" in config and "val_fraction" in config:
                return config
    raise UserError(
        f"--bench {HELD_OUT} needs the drafter's training run: give --drafter a `draftsmith train` output "
        f"folder (its run.yaml names the dataset and the validation split); {drafter} is not one"
    )


def held_out_rows(config: dict[str, Any], dataset: TokenizedDataset) -> list[int]:
    """The dataset rows of the run's validation samples, in split order."""
    if not config["val_fraction"]:
        raise UserError(
            f"--bench {HELD_OUT}: the run held nothing out (--val-fraction 0); train with a validation split"
        )
    rows = list(range(len(dataset)))  # online training: the source's i-th sample is the dataset's i-th
    if config.get("hidden"):  # offline: the store's samples, mapped back to the dataset's rows
        from draftsmith.data.store import StoreReader, dataset_rows

        rows = dataset_rows(config["hidden"], StoreReader(config["hidden"]).sample_ids, dataset)
    seed = config.get("val_seed", config.get("seed", 0))  # runs before --val-seed split by --seed
    _, val_idx = split_indices(len(rows), config["val_fraction"], seed)
    return [rows[i] for i in val_idx]


def first_turns(dataset: TokenizedDataset, rows: list[int], tokenizer: Any) -> tuple[list[Question], int]:
    """The first user turn of each sample in `rows` as a question, and how many samples did not
    decode to the template's first-turn shape (left out)."""
    before, after = around_message(tokenizer, [], "user", add_generation_prompt=True)  # a first turn's text around it
    questions, unmatched = [], 0
    for i in rows:
        sample = dataset[i]
        answer = sample["loss_mask"].nonzero()
        if len(answer) == 0:
            unmatched += 1
            continue
        prefix = tokenizer.decode(sample["input_ids"][: int(answer[0])].tolist(), skip_special_tokens=False)
        if not (prefix.startswith(before) and prefix.endswith(after) and len(prefix) > len(before) + len(after)):
            unmatched += 1
            continue
        questions.append(Question(int(sample["sample_id"]), HELD_OUT, [prefix[len(before) : len(prefix) - len(after)]]))
    return questions, unmatched


def held_out_questions(drafter: Path, tokenizer: Any, num: int) -> list[Question]:
    """`num` first user turns spread over the validation split of the run that trained `drafter`."""
    config = training_config(Path(drafter))
    dataset = load_dataset(Path(config["dataset_dir"]))
    rows = held_out_rows(config, dataset)
    questions, unmatched = first_turns(dataset, rows, tokenizer)
    if not questions:
        raise UserError(
            f"--bench {HELD_OUT}: none of the {len(rows)} held-out samples of {config['dataset_dir']} starts "
            "with a first user turn in the target's chat template (completion-mode data, or another template)"
        )
    picked = [questions[i] for i in spread(len(questions), num)]
    print(
        f"[eval] {HELD_OUT}: {len(picked)} of the {len(questions)} first user turns of the run's validation split "
        f"({config['dataset_dir']}; {unmatched} of {len(rows)} samples left out: not the template's first turn)",
        flush=True,
    )
    return picked
