"""Synth filters: de-duplication, thinking blocks, repetition loops, drop verdicts."""

from draftsmith.synth.filters import dedupe, judge, repetition_loop, strip_thinking


def _conv(cid, *users, system=None):
    msgs = [{"role": "system", "content": system}] if system else []
    msgs += [{"role": "user", "content": u} for u in users]
    return {"id": cid, "messages": msgs}


def test_dedupe_ignores_whitespace_and_case_but_not_system_or_turns():
    convs = [
        _conv("a", "What is 2+2?"),
        _conv("b", "what is  2+2? "),
        _conv("c", "What is 2+2?", system="Be terse."),
        _conv("d", "What is 2+2?", "And 3+3?"),
        _conv("e", "What is 2+3?"),
    ]
    kept, dropped = dedupe(convs)
    assert [c["id"] for c in kept] == ["a", "c", "d", "e"] and dropped == 1


def test_strip_thinking():
    assert strip_thinking("<think>\nlet me see\n</think>\n\nThe answer is 4.") == "The answer is 4."
    assert strip_thinking("<think>a</think>\nB\n<think>c</think>\nD") == "B\nD"
    assert strip_thinking("Sure. <think>never closed") == "Sure."
    assert strip_thinking("no blocks") == "no blocks"


def test_repetition_loop():
    assert repetition_loop("Intro. " + "the cat sat " * 8)
    assert repetition_loop("x" + "!" * 80)
    assert repetition_loop("Answer:" + "\n" * 70)
    assert not repetition_loop("Natalia sold 48/2 = 24 clips in May. She sold 48+24 = 72 clips in total.")
    assert not repetition_loop("ha" * 5)  # too short to call a loop
    assert not repetition_loop("step one; " * 3 + "done.")


def test_judge_order():
    assert judge("   ", finished=True) == "empty"
    assert judge("ok " * 40, finished=False) == "loop"
    assert judge("A fine answer that ran out of tokens", finished=False) == "no_eot"
    assert judge("A fine answer.", finished=True) is None
