"""`eval --bench held-out` (issue 17): the first user turns of the validation split of the run
that trained the drafter, recovered from the tokens of `prepare`'s dataset, are the very prompts
its held-out samples were made from; eval decodes them as it decodes MT-bench."""

from __future__ import annotations

import json

import pytest
import yaml
from typer.testing import CliRunner

from draftsmith.cli import app
from draftsmith.data.dataset import split_indices
from draftsmith.errors import UserError
from draftsmith.evaluate.heldout import HELD_OUT, held_out_questions
from draftsmith.target import load_tokenizer

PROMPTS = [f"Question {i}: what is {i} plus {i}?\nThink  twice." for i in range(20)]  # newlines, double spaces


@pytest.fixture(scope="module")
def dataset(tmp_path_factory, tiny_target_dir):
    root = tmp_path_factory.mktemp("heldout")
    chats = root / "chats.jsonl"
    chats.write_text(
        "".join(
            json.dumps(
                {
                    "messages": [
                        {"role": "user", "content": p},
                        {"role": "assistant", "content": f"It is {2 * i}."},
                        {"role": "user", "content": "And twice that?"},
                        {"role": "assistant", "content": f"{4 * i}."},
                    ]
                }
            )
            + "\n"
            for i, p in enumerate(PROMPTS)
        )
    )
    res = CliRunner().invoke(app, ["prepare", str(chats), "--target", str(tiny_target_dir), "--out", str(root / "ds")])
    assert res.exit_code == 0, res.output
    return root / "ds"


def fake_run(folder, **config):
    """A training run's folder as eval reads it: run.yaml's config and a drafter/ inside."""
    (folder / "drafter").mkdir(parents=True)
    (folder / "run.yaml").write_text(yaml.safe_dump({"command": "train", "config": config}))
    return folder


@pytest.mark.slow
def test_held_out_turns_are_the_prompts_of_the_runs_split(dataset, tiny_target_dir, tmp_path):
    tok = load_tokenizer(str(tiny_target_dir))
    run = fake_run(tmp_path / "run", dataset_dir=str(dataset), val_fraction=0.25, val_seed=3, seed=0, hidden=None)
    _, val_idx = split_indices(len(PROMPTS), 0.25, 3)
    for drafter in (run, run / "drafter"):  # the train folder or the drafter inside it
        questions = held_out_questions(drafter, tok, 80)
        assert [q.turns for q in questions] == [[PROMPTS[i]] for i in val_idx]  # the first turns only
        assert {q.category for q in questions} == {HELD_OUT}
    legacy = fake_run(
        tmp_path / "legacy", dataset_dir=str(dataset), val_fraction=0.25, seed=3
    )  # before --val-seed: --seed split
    assert [q.turns for q in held_out_questions(legacy, tok, 80)] == [[PROMPTS[i]] for i in val_idx]
    wide = fake_run(tmp_path / "wide", dataset_dir=str(dataset), val_fraction=0.5, val_seed=0)
    picked = held_out_questions(wide, tok, 4)  # 4 of 10, spread over the split, not its first 4
    _, val_idx = split_indices(len(PROMPTS), 0.5, 0)
    assert [q.turns[0] for q in picked] == [PROMPTS[val_idx[i]] for i in (1, 3, 6, 8)]


@pytest.mark.slow
def test_offline_runs_split_the_stores_samples(dataset, tiny_target_dir, tmp_path):
    """Offline training splits the store's samples, in the store's order: the held-out prompts
    are those of the store samples at the split's indices (found by their sample ids)."""
    from draftsmith.data.dataset import load_dataset
    from draftsmith.data.store import StoreReader, dataset_rows

    res = CliRunner().invoke(
        app,
        [
            "extract",
            str(dataset),
            "--target",
            str(tiny_target_dir),
            "--out",
            str(tmp_path / "store"),
            "--device",
            "cpu",
        ],
    )
    assert res.exit_code == 0, res.output
    ids = [int(s) for s in StoreReader(tmp_path / "store").sample_ids]
    run = fake_run(
        tmp_path / "run", dataset_dir=str(dataset), hidden=str(tmp_path / "store"), val_fraction=0.25, val_seed=1
    )
    _, val_idx = split_indices(len(ids), 0.25, 1)
    questions = held_out_questions(run, load_tokenizer(str(tiny_target_dir)), 80)
    assert [q.question_id for q in questions] == [ids[i] for i in val_idx]
    assert [q.turns[0] for q in questions] == [PROMPTS[ids[i]] for i in val_idx]  # prepare numbers the chats 0..19
    with pytest.raises(UserError, match=r"holds samples \[999\] that the dataset .* lacks"):  # a store of other data
        dataset_rows(tmp_path / "store", [*ids, 999], load_dataset(dataset))


def test_held_out_refuses_what_has_no_split(dataset, tiny_target_dir, tmp_path):
    tok = load_tokenizer(str(tiny_target_dir))
    with pytest.raises(UserError, match="needs the drafter's training run"):
        held_out_questions(tmp_path, tok, 80)  # an export or any other folder: no run.yaml
    none = fake_run(tmp_path / "none", dataset_dir=str(dataset), val_fraction=0.0, val_seed=0)
    with pytest.raises(UserError, match="held nothing out"):
        held_out_questions(none, tok, 80)


@pytest.mark.slow
def test_compared_drafters_must_have_held_out_the_same_prompts(dataset, tiny_target_dir, tmp_path):
    """`eval --compare --bench held-out` asks --drafter's held-out prompts of every drafter: only
    where each compared run held out the same ones, which none of them trained on."""
    from draftsmith.evaluate.config import EvalConfig
    from draftsmith.evaluate.run import resolve_questions

    runs = {
        name: fake_run(tmp_path / name, dataset_dir=str(dataset), val_fraction=0.25, val_seed=seed)
        for name, seed in (("a", 3), ("b", 3), ("other", 4))
    }

    def questions(*compare):
        cfg = EvalConfig(
            drafter=runs["a"], compare=list(compare), bench=HELD_OUT, target=str(tiny_target_dir), out=tmp_path / "e"
        )
        return resolve_questions(cfg, on_gpu=False)

    assert questions(runs["b"]) == questions()
    with pytest.raises(UserError, match="held out different prompts"):
        questions(runs["b"], runs["other"])


@pytest.mark.slow
def test_eval_measures_tau_on_the_held_out_prompts(dataset, tiny_target_dir, tmp_path):
    """End to end on CPU: train a drafter (4 steps) with a split, then eval it on that split."""
    res = CliRunner().invoke(
        app,
        [
            "train",
            str(dataset),
            "--target",
            str(tiny_target_dir),
            "--out",
            str(tmp_path / "train"),
            "--steps",
            "4",
            "--depth",
            "2",
            "--batch-tokens",
            "96",
            "--draft-vocab-size",
            "300",
            "--val-fraction",
            "0.25",
            "--device",
            "cpu",
        ],
    )
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(
        app,
        [
            "eval",
            "--target",
            str(tiny_target_dir),
            "--drafter",
            str(tmp_path / "train"),
            "--bench",
            HELD_OUT,
            "--num-questions",
            "3",
            "--depth",
            "2",
            "--max-new-tokens",
            "8",
            "--no-speed",
            "--device",
            "cpu",
            "--out",
            str(tmp_path / "eval"),
        ],
    )
    assert res.exit_code == 0, res.output
    assert "held-out: 3 of the 5 first user turns of the run's validation split" in res.output
    report = json.loads((tmp_path / "eval" / "report.json").read_text())
    assert report["bench"] == HELD_OUT and report["questions"] == 3 and list(report["categories"]) == [HELD_OUT]
