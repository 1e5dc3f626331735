"""`draftsmith synth --mix`: screening (length, script, exact and near duplicates), weights and
caps, per-task caps, seeded and monotone selection, mix.json and its data card, the errors
(each names the source, nothing left behind), and a CLI run on the tiny model that resumes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from draftsmith.cli import app
from draftsmith.data.sources import data_card, mix_card
from draftsmith.errors import UserError
from draftsmith.synth.mix import load_mix, select, shares
from draftsmith.synth.screen import Screen, jaccard, script_of, shingles
from tests.helpers import SMOLLM2, write_jsonl

TEXT = (
    "the quick brown fox jumps over the lazy dog while the farmer watches from the porch and "
    "drinks a cup of coffee before the long day of work in the fields begins"
)


def user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def write_mix(tmp_path: Path, body: str, name: str = "mix.yaml") -> Path:
    path = tmp_path / name
    path.write_text(body)
    return path


def test_script_of():
    assert script_of("Hello, world") == "latin" and script_of("1234 !?") == "none"
    assert script_of("Привет, как дела?") == "cyrillic" and script_of("你好，世界") == "han"
    assert script_of("こんにちは") == "kana" and script_of("مرحبا بالعالم") == "arabic"
    assert script_of("Ｈｅｌｌｏ") == "latin"  # fullwidth letters


def test_screen_filters_and_duplicates():
    s = Screen(min_chars=5, max_chars=300, scripts={"latin"}, near=0.8)
    assert s.check(user("hi")) == "too_short" and s.check(user("x" * 301)) == "too_long"
    assert s.check(user("Привет, как у тебя дела?")) == "script"
    assert s.check([{"role": "system", "content": "only"}]) == "no_user_turn"
    assert s.check(user(TEXT)) is None
    s.add(user(TEXT))
    assert s.check(user("  " + TEXT.upper() + " ")) == "duplicate"  # whitespace and case do not count
    near = TEXT.replace("coffee", "tea")
    assert jaccard(shingles(TEXT), shingles(near)) >= 0.8 and s.check(user(near)) == "near_duplicate"
    assert s.check(user("an entirely different question about prime numbers and their gaps")) is None
    # the same user turn under another system prompt is no exact duplicate, but a near one (system left out)
    assert s.check([{"role": "system", "content": "Be brief."}, *user(TEXT)]) == "near_duplicate"
    off = Screen(exact=False, near=None, exclude_scripts={"cyrillic"})
    off.add(user(TEXT))
    assert off.check(user(TEXT)) is None and off.check(user("Привет, как у тебя дела?")) == "script"


def test_shares_split_total_by_weight_and_respect_caps(tmp_path):
    mix = load_mix(
        write_mix(
            tmp_path,
            "total: 10\nsources:\n  - {source: a.jsonl, weight: 1}\n"
            "  - {source: b.jsonl, weight: 2, cap: 5}\n  - {source: c.jsonl, weight: 1}\n"
            "  - {source: d.jsonl, cap: 3}\n  - {source: e.jsonl}\n",
        )
    )
    # 10 x 1/4, 2/4, 1/4 = 2.5, 5, 2.5: the largest remainders round up until the shares add up to 10
    assert shares(mix) == [3, 5, 2, 3, None]


def make_sources(tmp_path: Path) -> tuple[Path, Path]:
    a = write_jsonl(
        tmp_path / "alpha.jsonl",
        [{"id": f"a{i}", "prompt": f"Question number {i}: what is {i} times {i + 3}?"} for i in range(40)],
    )
    b = write_jsonl(
        tmp_path / "beta.jsonl",
        [
            *(
                {"id": f"b{i}", "prompt": f"Tell me a fact about the number {i * 7} and why it matters."}
                for i in range(20)
            ),
            {"id": "copy", "prompt": "question number 3:   what is 3 times 6?"},  # an exact copy of alpha's a3
            {"id": "tiny", "prompt": "Hi"},
            {"id": "ru", "prompt": "Расскажи мне что-нибудь интересное о числе семь."},
        ],
    )
    return a, b


def test_selection_is_seeded_capped_and_monotone(tmp_path):
    make_sources(tmp_path)
    body = "seed: {seed}\ndedup: {{near: null}}\nsources:\n  - {{source: alpha.jsonl, cap: {cap}}}\n  - {{source: beta.jsonl}}\n"

    def ids(seed, cap):
        return [w.id for w in select(write_mix(tmp_path, body.format(seed=seed, cap=cap)), 0, []).works]

    first = ids(1, 10)
    assert first == ids(1, 10)  # the same seed selects the same prompts, in the same order
    assert first != ids(2, 10)
    alpha = [i for i in first if i.startswith("alpha:")]
    assert len(alpha) == 10 and all(i.endswith(":s0") for i in first)
    assert set(alpha) <= set(ids(1, 20))  # raising a cap keeps every prompt taken before
    plan = select(write_mix(tmp_path, body.format(seed=1, cap=40)), 7, [{"role": "system", "content": "S"}])
    beta = next(s for s in plan.stats if s["name"] == "beta")
    assert beta["available"] == 23 and beta["selected"] == 22 and beta["dropped"] == {"duplicate": 1}
    assert plan.works[0].system == [{"role": "system", "content": "S"}] and plan.works[0].id.endswith(":s7")


def test_filters_per_task_caps_and_magpie(tmp_path):
    make_sources(tmp_path)
    data = tmp_path / "evals_data"
    for task in ("t1", "t2", "t3"):
        (data / task).mkdir(parents=True)
        write_jsonl(
            data / task / "samples.jsonl",
            [{"input": [{"role": "user", "content": f"{task} prompt {i} about topic {i * 13}"}]} for i in range(10)],
        )
    mix = write_mix(
        tmp_path,
        f"""seed: 3
max_turns: 1
filters: {{min_chars: 5, scripts: [latin]}}
sources:
  - {{source: beta.jsonl, name: b}}
  - {{source: evals, path: {data}, per_task_cap: 4, cap: 10}}
  - {{source: magpie, cap: 3, turns: 2}}
""",
    )
    plan = select(mix, 0, [])
    b, ev, mg = plan.stats
    assert b["dropped"] == {"script": 1, "too_short": 1} and b["selected"] == 21
    assert ev["selected"] == 10 and max(ev["per_task"].values()) == 4 and ev["tasks"] == 3
    magpie = [w for w in plan.works if w.id.startswith("magpie:")]
    assert [w.id for w in magpie] == ["magpie:0:s0", "magpie:1:s0", "magpie:2:s0"] and magpie[0].users == [None, None]
    assert mg == {
        "name": "magpie",
        "source": "magpie",
        "license": "generated by the target",
        "wanted": 3,
        "selected": 3,
        "turns": 2,
    }


@pytest.mark.parametrize(
    "body, message",
    [
        ("sources:\n  - {source: nowhere_at_all}\n", r"unknown source 'nowhere_at_all'"),
        (
            "sources:\n  - {source: alpha.jsonl}\n  - {source: beta.jsonl, name: alpha}\n",
            r"two sources are named \['alpha'\]",
        ),
        ("sources:\n  - {source: alpha.jsonl, weight: 1}\n", "has a weight but the mix has no 'total'"),
        ("sources:\n  - {source: magpie}\n", "magpie needs a cap or a weight"),
        ("sources:\n  - {source: alpha.jsonl, capp: 3}\n", r"sources.0.capp: Extra inputs are not permitted"),
        (
            "sources:\n  - {source: alpha.jsonl}\n  - {source: beta.jsonl, name: b}\nfilters: {min_chars: 70}\n",
            r"source 'alpha' \(.*alpha.jsonl\) leaves no prompt: 40 available, dropped: too_short 40",
        ),
        (
            "sources:\n  - {source: alpha.jsonl}\n  - {source: alpha.jsonl, name: again}\n",
            r"source 'again' .* leaves no prompt: 40 available, dropped: duplicate 40",
        ),
    ],
)
def test_bad_mixes_name_the_source(tmp_path, body, message):
    make_sources(tmp_path)
    with pytest.raises(UserError, match=message):
        select(write_mix(tmp_path, body), 0, [])


def test_data_card_of_mix_json(tmp_path):
    mix_json = {
        "mix": "/x/mix.yaml",
        "output": "c.jsonl",
        "seed": 2,
        "kept": 5,
        "sources": [
            {
                "name": "evals",
                "source": "evals",
                "license": "MIT",
                "selected": 4,
                "synth": {"kept": 3},
                "license_excluded_tasks": ["ballots"],
            },
            {
                "name": "magpie",
                "source": "magpie",
                "license": "generated by the target",
                "selected": 2,
                "synth": {"kept": 2},
            },
        ],
    }
    card = data_card(mix_json)
    assert card == {
        "mix": "mix.yaml",
        "seed": 2,
        "conversations": 5,
        "sources": [
            {"name": "evals", "source": "evals", "license": "MIT", "conversations": 3, "left_out": ["ballots"]},
            {"name": "magpie", "source": "magpie", "license": "generated by the target", "conversations": 2},
        ],
    }
    (tmp_path / "c.jsonl").write_text("")
    (tmp_path / "mix.json").write_text(json.dumps(mix_json))  # where a draftsmith before issue 55 wrote it
    assert mix_card(tmp_path / "c.jsonl") == card
    (tmp_path / "other.jsonl").write_text("")
    assert mix_card(tmp_path / "other.jsonl") is None  # that mix.json belongs to another output
    (tmp_path / "other.synth").mkdir()  # where synth writes it now
    (tmp_path / "other.synth" / "mix.json").write_text(json.dumps({**mix_json, "output": "other.jsonl"}))
    assert mix_card(tmp_path / "other.jsonl") == card


def synth_mix(tmp_path, target, mix, *extra):
    out = tmp_path / "out" / "conversations.jsonl"
    args = [
        "synth",
        "--mix",
        str(mix),
        "--target",
        str(target),
        "--out",
        str(out),
        "--max-new-tokens",
        "4",
        "--batch-size",
        "8",
        "--keep-unfinished",
        "--temperature",
        "1",
        "--device",
        "cpu",
        *extra,
    ]
    return CliRunner().invoke(app, args), out


def test_cli_synth_mix_writes_mix_json_and_resumes(tmp_path, tiny_target_dir):
    make_sources(tmp_path)
    mix = write_mix(
        tmp_path, "seed: 5\nsources:\n  - {source: alpha.jsonl, cap: 3}\n  - {source: beta.jsonl, name: b, cap: 2}\n"
    )
    res, out = synth_mix(tmp_path, tiny_target_dir, mix)
    assert res.exit_code == 0, res.output
    records = [json.loads(line) for line in out.read_text().splitlines()]
    dropped = (
        [json.loads(line) for line in (out.parent / "conversations.dropped.jsonl").read_text().splitlines()]
        if (out.parent / "conversations.dropped.jsonl").exists()
        else []
    )
    assert len(records) + len(dropped) == 5
    assert sorted({r["id"].split(":")[0] for r in records + dropped}) == ["alpha", "b"]
    report = json.loads((out.parent / "conversations.synth" / "mix.json").read_text())
    assert report["finished"] and report["output"] == "conversations.jsonl" and report["selected"] == 5
    assert report["kept"] == len(records) and report["outside_mix"] == 0
    alpha = report["sources"][0]
    assert alpha["name"] == "alpha" and alpha["selected"] == 3 and alpha["dropped"]["over_cap"] == 37
    assert alpha["synth"]["kept"] + sum(alpha["synth"]["dropped"].values()) == 3
    progress = json.loads((out.parent / "conversations.synth" / "progress.json").read_text())
    assert progress["counters"]["source alpha"] == "3/3 done" and progress["counters"]["source b"] == "2/2 done"
    # a rerun finds everything done, generates nothing and writes no line twice
    res, _ = synth_mix(tmp_path, tiny_target_dir, mix)
    assert res.exit_code == 0, res.output
    assert [json.loads(line) for line in out.read_text().splitlines()] == records
    progress = json.loads((out.parent / "conversations.synth" / "progress.json").read_text())
    assert progress["skipped"] == 5 and progress["done"] == 0 and progress["counters"]["source b"] == "2/2 done"


def test_cli_bad_mix_leaves_nothing_behind(tmp_path, tiny_target_dir):
    make_sources(tmp_path)
    mix = write_mix(
        tmp_path,
        "sources:\n  - {source: alpha.jsonl}\n  - {source: beta.jsonl, per_task_cap: 1}\n"
        "filters: {scripts: [cyrillic]}\n",
    )
    res, out = synth_mix(tmp_path, tiny_target_dir, mix)
    assert res.exit_code == 2 and "source 'alpha'" in res.output and "script 40" in res.output
    assert not out.parent.exists()
    p = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "hi"}])
    res, _ = synth_mix(tmp_path, tiny_target_dir, mix, str(p))
    assert res.exit_code == 2 and "--mix lists the sources itself" in res.output


@pytest.mark.slow
def test_a_mix_source_is_an_input_synth_never_writes(tmp_path):
    """An earlier synth's conversations, listed as a mix source, are never the --out they are read from."""
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"id": "p0", "prompt": "What is 2 plus 2?"}])
    conv = tmp_path / "c.jsonl"
    common = ["--target", SMOLLM2, "--max-new-tokens", "8", "--keep-unfinished"]  # the tiny model answers nothing
    assert CliRunner().invoke(app, ["synth", str(prompts), "--out", str(conv), *common]).exit_code == 0
    mix = write_mix(tmp_path, "sources:\n  - {source: c.jsonl}\n")
    before = conv.read_bytes()
    res = CliRunner().invoke(app, ["synth", "--mix", str(mix), "--out", str(conv), *common])
    assert res.exit_code == 2 and "this command's input" in res.output, res.output
    assert conv.read_bytes() == before


def test_freeze_keeps_ids_names_and_licenses(tmp_path):
    from draftsmith.synth.mix import freeze

    make_sources(tmp_path)
    mix = write_mix(
        tmp_path,
        "seed: 4\nmax_turns: 1\nsources:\n  - {source: alpha.jsonl, cap: 5, license: MIT}\n"
        "  - {source: beta.jsonl, name: b, cap: 4}\n  - {source: magpie, cap: 2, turns: 2}\n",
    )
    original = select(mix, 3, [])
    frozen = freeze(mix, tmp_path / "frozen")
    again = select(frozen, 3, [])
    assert sorted(w.id for w in again.works) == sorted(w.id for w in original.works)
    assert {w.id: (w.system, w.users) for w in again.works} == {w.id: (w.system, w.users) for w in original.works}
    assert [(s["name"], s["source"], s["license"], s["selected"]) for s in again.stats] == [
        ("alpha", str(tmp_path / "alpha.jsonl"), "MIT", 5),
        ("b", str(tmp_path / "beta.jsonl"), "unknown", 4),
        ("magpie", "magpie", "generated by the target", 2),
    ]
