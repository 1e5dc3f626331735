"""Question loading and the report's numbers."""

from __future__ import annotations

import json

import pytest

from draftsmith.errors import UserError
from draftsmith.evaluate.questions import load_questions, turn_prompt
from draftsmith.evaluate.report import acceptance, build_report, greedy_check_note, markdown, plot
from tests.helpers import REPORT_META


def test_mt_bench_and_jsonl_formats(tmp_path, tokenizer):
    mt = load_questions("mt_bench")
    assert len(mt) == 80 and all(len(q.turns) == 2 for q in mt)
    f = tmp_path / "q.jsonl"
    f.write_text(
        "\n".join(
            json.dumps(r)
            for r in [
                {"turns": ["a", "b"], "category": "x"},
                {"prompt": "p"},
                {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]},
            ]
        )
        + "\n"
    )
    qs = load_questions(str(f))
    assert [q.turns for q in qs] == [["a", "b"], ["p"], ["u"]]
    assert [q.question_id for q in qs] == [1, 2, 3] and qs[1].category == "all"
    assert len(load_questions(str(f), limit=2)) == 2
    ids = turn_prompt(tokenizer, ["hi", "more"], ["hello"])
    text = tokenizer.decode(ids)
    assert text.index("hi") < text.index("hello") < text.index("more") and text.rstrip().endswith("assistant")


def test_bad_question_names_line(tmp_path):
    f = tmp_path / "q.jsonl"
    f.write_text('{"prompt": "ok"}\n{"turns": []}\n')
    with pytest.raises(UserError, match="q.jsonl:2"):
        load_questions(str(f))
    with pytest.raises(UserError, match="no such file"):
        load_questions(str(tmp_path / "missing.jsonl"))


def test_acceptance_numbers():
    a = acceptance([0, 2, 3, 1], depth=3)
    assert a["tau"] == pytest.approx((1 + 3 + 4 + 2) / 4)
    assert a["accept_per_position"] == [0.75, 0.5, 0.25]
    assert a["accept_conditional"] == [0.75, pytest.approx(0.6667, abs=1e-4), 0.5]
    assert a["tau_distribution"] == {"1": 1, "2": 1, "3": 1, "4": 1}


# two turns of a 2-deep chain, and the run's settings: the report built from them
TURNS = [
    {
        "category": "a",
        "turn": 1,
        "accepts": [1, 1],
        "spec_tokens": 4,
        "spec_seconds": 1.0,
        "plain_tokens": 4,
        "plain_seconds": 2.0,
        "matches_plain": True,
    },
    {
        "category": "b",
        "turn": 2,
        "accepts": [0],
        "spec_tokens": 1,
        "spec_seconds": 1.0,
        "plain_tokens": 1,
        "plain_seconds": 0.5,
        "matches_plain": False,
    },
]


def test_report_speedup_and_categories(tmp_path):
    r = build_report(TURNS, depth=2, meta=REPORT_META)
    assert r["tau"] == pytest.approx(5 / 3, abs=1e-4) and r["tokens"] == 5
    assert (
        r["spec_tok_per_s"] == 2.5
        and r["plain_tok_per_s"] == pytest.approx(2.0)
        and r["speedup"] == pytest.approx(1.25)
    )
    assert r["categories"]["a"]["speedup"] == 2.0 and r["categories"]["b"]["tau"] == 1.0
    assert r["greedy_turns_checked"] == 2 and r["greedy_turns_matching_plain"] == 1
    assert r["tau_by_turn"] == {"1": 2.0, "2": 1.0}
    assert r["tau_by_answer_half"] == {"first": 2.0, "second": 1.5}  # [1] | [1] and [0]
    assert "by turn 1: 2.00, 2: 1.00; first / second half of each answer 2.00 / 1.50" in markdown(r)
    assert "1/2 turns identical to plain decoding (in fp32 every turn should match: a differing one is a fault" in (
        markdown(r)
    )
    bf16 = markdown({**r, "dtype": "bfloat16"})
    assert "(bfloat16 rounding: a verification forward" in bf16 and "`--kernel-check`" in bf16
    assert "(rounding: vLLM verifies" in markdown({**r, "dtype": "bfloat16", "engine": "vllm"})
    assert "2/2 turns identical to plain decoding\n" in markdown({**r, "greedy_turns_matching_plain": 2})
    no_speed = build_report([{**TURNS[0], "plain_seconds": None}], depth=2, meta=REPORT_META)
    assert no_speed["speedup"] is None
    assert "speed-up 1.25x" in markdown(r)
    plot(r, tmp_path)
    assert (tmp_path / "acceptance.png").stat().st_size > 0 and (tmp_path / "tau.png").stat().st_size > 0


def test_a_speed_up_above_tau_is_flagged_as_noise_and_one_below_1_gets_a_hint(tmp_path):
    from draftsmith.evaluate.report import summary_line

    base = {"mode": "chain", "questions": 3, "tokens": 96, "spec_tok_per_s": 18.3, "plain_tok_per_s": 10.0}
    noisy = summary_line({**base, "tau": 1.0, "speedup": 1.83}, tmp_path)  # the probe's busy-CPU run
    assert "noisy timing" in noisy and "cannot come from the drafter" in noisy
    assert "noisy" not in summary_line({**base, "tau": 3.4, "speedup": 2.47}, tmp_path)
    slower = {**base, "tau": 3.05, "speedup": 0.92, "batch_size": 16, "engine": "draftsmith", "depth_requested": 7}
    assert "slower than plain decoding at batch 16: --depth auto" in summary_line(slower, tmp_path)
    assert "--sweep 3:16" in summary_line({**slower, "engine": "vllm"}, tmp_path)
    assert "slower" not in summary_line({**slower, "speedup": 1.13}, tmp_path)


def test_a_vllm_sweep_names_its_fastest_depth_per_batch_size(tmp_path):
    """`--engine vllm --sweep`: the depth to serve with at each batch size timed at several
    depths (the recipe's drafter on an H100: K=5 beat K=7 and K=3 at batch 1), in report.md and
    the summary line; none where a batch size ran one depth."""
    from draftsmith.evaluate.report import fastest_depths, summary_line

    def one(depth, batch, speedup):
        counters = {"accepted": 1, "drafts": 1, "accepted_per_pos": [1]}
        rates = {"spec_tok_per_s": speedup, "plain_tok_per_s": 1.0, "counters_tau": 3.0}
        return {
            "depth": depth,
            "batch_size": batch,
            "speedup": speedup,
            "tau": 3.0,
            "steps": 1,
            "counters": counters,
            **rates,
        }

    passes = [one(7, 1, 1.59), one(7, 80, 0.58), one(5, 1, 1.83), one(3, 1, 1.62)]
    r = {"vllm": {"version": "0.26.0", "passes": passes, "start_seconds": {"spec": 1.0}}}
    assert {b: p["depth"] for b, p in fastest_depths(r).items()} == {1: 5}  # batch 80 ran K=7 alone
    base = {"mode": "chain", "questions": 3, "tokens": 96, "tau": 3.98, "speedup": 1.59}
    line = summary_line({**base, **r, "spec_tok_per_s": 675.0, "plain_tok_per_s": 425.8}, tmp_path)
    assert "[vLLM's fastest at batch 1: K=5, 1.83x (num_speculative_tokens 5)]" in line
    assert "fastest" not in summary_line(
        {**base, "vllm": {"passes": passes[:2]}, "spec_tok_per_s": 1.0, "plain_tok_per_s": 1.0}, tmp_path
    )
    assert fastest_depths({}) == {}
    md = markdown({**build_report(TURNS, depth=2, meta=REPORT_META), **r})
    assert [ln for ln in md.splitlines() if "fastest" in ln] == [
        "- **vLLM's fastest at batch 1: K=5, 1.83x (num_speculative_tokens 5)**"
    ]


def test_the_greedy_check_says_why_turns_differ():
    """The report's greedy-check line: nothing when every turn matches; a fault in fp32; bf16
    rounding otherwise, pointing to --kernel-check, or to its count where it ran."""
    base = {"greedy_turns_checked": 4, "greedy_turns_matching_plain": 4, "dtype": "bfloat16", "engine": "draftsmith"}
    assert greedy_check_note(base) == ""
    differ = {**base, "greedy_turns_matching_plain": 1}
    assert "fault" in greedy_check_note({**differ, "dtype": "float32"})
    assert "rounding" in greedy_check_note(differ) and "--kernel-check" in greedy_check_note(differ)
    checked = {**differ, "verify_shape_turns_checked": 4, "verify_shape_turns_matching_plain": 1}
    assert "kernel-shape check below" in greedy_check_note(checked)
    assert "vLLM" in greedy_check_note({**differ, "engine": "vllm", "target_fused": None})
