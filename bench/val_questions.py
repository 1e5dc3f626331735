"""A training run's held-out samples as an eval question set (issue 17).

Training reports a *simulated* τ on its validation split; eval *measures* τ on MT-bench. Their
ratio mixes two things: how well the simulation predicts real decoding, and how far MT-bench
is from the training distribution. This writes the first user turn of each validation sample
(the split `train` holds out: same dataset, --val-fraction and --val-seed) as a JSONL question set,
so that `draftsmith eval --bench` measures τ on the training distribution itself:

    MT-bench τ / val τ = (held-out measured τ / val τ) × (MT-bench τ / held-out measured τ)

    python bench/val_questions.py RUN/prepare --target T --out val_questions.jsonl [--num 80]  # spread over the split
    draftsmith eval --target T --drafter RUN/train --bench val_questions.jsonl --no-speed ...

A turn's text is recovered from the sample's tokens: the chat template applied to one sentinel
user message gives the text around a first user turn (system prompt, role markers); the tokens
before the sample's first answer token decode to that text with the user's words in place of
the sentinel. Samples whose prefix does not decode that way are counted and left out.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from draftsmith.data.chat import chat_template
from draftsmith.data.dataset import load_dataset
from draftsmith.train.batching import split_indices

SENTINEL = "\x00draftsmith-user-turn\x00"


def user_wrap(tokenizer: Any) -> tuple[str, str]:
    """The chat template's text before and after a first user turn (generation prompt included)."""
    text = tokenizer.apply_chat_template([{"role": "user", "content": SENTINEL}], chat_template=chat_template(tokenizer),
                                         add_generation_prompt=True, tokenize=False)
    before, after = text.split(SENTINEL)
    return before, after


def held_out_turns(dataset_dir: Path, tokenizer: Any, val_fraction: float = 0.05, val_seed: int = 0) -> tuple[list[dict], int]:
    """The validation samples' first user turns as questions, and how many samples did not
    decode to the template's first-turn shape (left out)."""
    ds = load_dataset(dataset_dir)
    _, val_idx = split_indices(len(ds), val_fraction, val_seed)
    before, after = user_wrap(tokenizer)
    questions, unmatched = [], 0
    for i in val_idx:
        sample = ds[i]
        answer = sample["loss_mask"].nonzero()
        if len(answer) == 0:
            unmatched += 1
            continue
        prefix = tokenizer.decode(sample["input_ids"][: int(answer[0])].tolist(), skip_special_tokens=False)
        if not (prefix.startswith(before) and prefix.endswith(after) and len(prefix) > len(before) + len(after)):
            unmatched += 1
            continue
        questions.append({"question_id": int(sample["sample_id"]), "category": "held-out",
                          "turns": [prefix[len(before): len(prefix) - len(after)]]})
    return questions, unmatched


def spread(questions: list[dict], num: int) -> list[dict]:
    """`num` questions evenly spaced over the split. `prepare` keeps its sources in the order
    they were synthesised (GSM8K first, then Magpie...), so the first N would be one source only."""
    if num >= len(questions):
        return questions
    return [questions[i * len(questions) // num] for i in range(num)]


def main() -> None:
    from draftsmith.target import load_tokenizer

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dataset", type=Path, help="the dataset `prepare` wrote (the one the drafter trained on)")
    ap.add_argument("--target", required=True, help="the target (its tokenizer decodes the samples)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--num", type=int, default=80, help="N validation samples that decode, evenly spaced over the split")
    ap.add_argument("--val-fraction", type=float, default=0.05, help="train's --val-fraction")
    ap.add_argument("--val-seed", type=int, default=0, help="train's --val-seed")
    args = ap.parse_args()
    if args.num < 1:
        ap.error(f"--num must be at least 1 (got {args.num})")
    questions, unmatched = held_out_turns(args.dataset, load_tokenizer(args.target), args.val_fraction, args.val_seed)
    args.out.write_text("".join(json.dumps(q) + "\n" for q in spread(questions, args.num)))
    print(f"[val_questions] {min(len(questions), args.num)} of {len(questions)} held-out first turns written to "
          f"{args.out}; {unmatched} samples left out (their prefix is not the template's first turn)", flush=True)


if __name__ == "__main__":
    main()
