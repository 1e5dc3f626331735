"""`draftsmith eval --compare`: several drafters (here EAGLE-3, P-EAGLE and DFlash) answer the
same questions in one run, on one engine, against one plain pass. Each drafter's answers and τ
are those it gets alone, its greedy answers equal plain decoding's, its report sits where the
side-by-side table says, and what cannot run side by side is refused before anything is written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from draftsmith.cli import app
from draftsmith.draft.checkpoint import save_drafter
from draftsmith.evaluate.run import entrant_names
from tests.helpers import random_dflash, random_drafter

QUESTIONS = [{"turns": ["What is 2+2?", "And 3+3?"]}, {"turns": ["Name a colour."]}, {"turns": ["Say hi."]}]


@pytest.fixture(scope="module")
def setup(tiny_model, tiny_target_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("compare")
    drafters = [
        save_drafter(random_drafter(tiny_model, draft_vocab_size=300), tmp / "runs" / "eagle" / "drafter"),
        save_drafter(random_drafter(tiny_model, draft_vocab_size=300, seed=1, method="peagle"), tmp / "runs" / "pe"),
        save_drafter(random_dflash(tiny_model), tmp / "runs" / "df"),
    ]
    (tmp / "q.jsonl").write_text("\n".join(json.dumps(q) for q in QUESTIONS) + "\n")
    return tiny_target_dir, drafters, tmp


def evaluate(setup, name: str, *options: str, code: int = 0):
    target, _, tmp = setup
    common = ["--target", str(target), "--bench", str(tmp / "q.jsonl"), "--max-new-tokens", "10", "--depth", "3"]
    res = CliRunner().invoke(app, ["eval", *common, "--out", str(tmp / name), *options])
    assert res.exit_code == code, res.output
    return res.output


def read(folder) -> tuple[dict, list]:
    answers = [json.loads(line)["token_ids"] for line in (folder / "answers.jsonl").read_text().splitlines()]
    return json.loads((folder / "report.json").read_text()), answers


@pytest.mark.slow
def test_drafters_side_by_side_answer_as_each_alone(setup):
    _, (eagle, peagle, dflash), tmp = setup
    others = f"{peagle},{dflash}"
    out = evaluate(setup, "side", "--drafter", str(eagle), "--compare", others, "--batch-size", "2", "--kernel-check")
    assert "drafter: eval: tau" in out and "pe: eval: tau" in out and "side/compare.md" in out
    compare = json.loads((tmp / "side" / "compare.json").read_text())
    assert [d["name"] for d in compare["drafters"]] == ["drafter", "pe", "df"]
    assert [d["method"] for d in compare["drafters"]] == ["eagle3", "peagle", "dflash"]
    assert (tmp / "side" / "compare.md").read_text().count("| chain K=3 |") == 3
    assert (tmp / "side" / "compare.png").stat().st_size > 0
    for path, d in zip((eagle, peagle, dflash), compare["drafters"], strict=True):
        report, answers = read(tmp / "side" / d["report"].removesuffix("report.json"))
        assert report["drafter"] == str(path) and report["tau"] == d["tau"] and report["batch_size"] == 2
        assert report["plain_tok_per_s"] == compare["plain_tok_per_s"]  # the one plain pass
        assert report["greedy_turns_matching_plain"] == report["greedy_turns_checked"] == 4
        assert report["verify_shape_turns_matching_plain"] == report["verify_shape_turns_checked"] == 4
        assert len(report["side_by_side_with"]) == 2 and str(path) not in report["side_by_side_with"]
        evaluate(setup, f"alone-{d['name']}", "--drafter", str(path), "--batch-size", "2")
        alone, alone_answers = read(tmp / f"alone-{d['name']}")
        assert answers == alone_answers and alone["tau"] == report["tau"]  # the same drafting as alone
        assert alone["side_by_side_with"] == [] and not (tmp / f"alone-{d['name']}" / "compare.json").exists()


@pytest.mark.parametrize(
    ("options", "says"),
    [
        (["--compare", "{eagle}"], "a drafter is given twice"),
        (["--compare", "{peagle}", "--engine", "vllm"], "vLLM serves one drafter per server"),
        (["--compare", "{peagle}", "--mode", "tree"], "is a P-EAGLE drafter (parallel drafting)"),
        (["--compare", "{other_layers}"], "the drafters read different target layers"),
    ],
)
def test_what_cannot_run_side_by_side_is_refused_before_writing(setup, tiny_model, options, says):
    _, (eagle, peagle, _), tmp = setup
    other = random_drafter(tiny_model, draft_vocab_size=300)
    other.config.aux_layer_ids = [0, 1, 3]  # the tiny target has but [0, 1, 2]: refused before it loads
    paths = {"eagle": eagle, "peagle": peagle, "other_layers": save_drafter(other, tmp / "runs" / "layers")}
    out = evaluate(setup, "refused", "--drafter", str(eagle), *(o.format(**paths) for o in options), code=2)
    assert says in " ".join(out.split()) and not (tmp / "refused").exists()


def test_names_tell_the_drafters_apart():
    assert entrant_names([Path("runs/a"), Path("runs/b")]) == ["a", "b"]
    assert entrant_names([Path("runs/a/drafter"), Path("runs/b/drafter")]) == ["a-drafter", "b-drafter"]
    assert entrant_names([Path("x/drafter"), Path("y")]) == ["drafter", "y"]
