"""The backend-independent turn-by-turn driver, with a scripted fake backend."""

from draftsmith.runtime.sampling import Sampling
from draftsmith.synth.turns import Generation, Work, stable_seed, synthesize

SAMPLING = Sampling(0.0, 1.0, 0, 16, 0)


class Scripted:
    """Answers every chat request with a function of its messages; records what it was sent."""

    name = "scripted"

    def __init__(self, answer, complete=None):
        self.answer, self.complete, self.sent = answer, complete, []

    def generate(self, requests, sampling):
        self.sent.append(requests)
        return [self.answer(r.messages) if r.prefix is None else self.complete(r) for r in requests]


def test_multi_turn_answers_are_conditioned_on_regenerated_history():
    backend = Scripted(lambda msgs: Generation(f"answer {len(msgs)} to {msgs[-1]['content']}", 3, True))
    sys = [{"role": "system", "content": "S"}]
    works = [Work("a", "a", sys, ["q1", "q2"]), Work("b", "b", [], ["only"])]
    synthesize(backend, works, SAMPLING, SAMPLING)
    assert works[0].messages == [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "answer 2 to q1"},
        {"role": "user", "content": "q2"},
        {"role": "assistant", "content": "answer 4 to q2"},
    ]
    assert works[1].messages[-1]["content"] == "answer 1 to only" and works[1].tokens == 3
    # turn 2's request carries turn 1's regenerated answer, not any original one
    second = backend.sent[1][0].messages
    assert second[2] == {"role": "assistant", "content": "answer 2 to q1"} and len(backend.sent[1]) == 1


def test_bad_turn_ends_or_drops_the_conversation():
    def answer(msgs):
        q = msgs[-1]["content"]
        return {
            "loop": Generation("na " * 40, 16, False),
            "long": Generation("", 0, False, too_long=True),
            "cut": Generation("half an answ", 16, False),
        }.get(q, Generation("fine", 2, True))

    works = [Work("x", "x", [], ["ok", "loop"]), Work("y", "y", [], ["long"]), Work("z", "z", [], ["cut"])]
    synthesize(Scripted(answer), works, SAMPLING, SAMPLING)
    x, y, z = works
    assert [m["content"] for m in x.messages] == ["ok", "fine"] and x.ended == "loop" and x.answered == 1
    assert y.messages == [] and y.ended == "too_long" and y.answered == 0
    assert z.ended == "no_eot" and z.answered == 0
    z2 = Work("z", "z", [], ["cut"])
    synthesize(Scripted(answer), [z2], SAMPLING, SAMPLING, keep_unfinished=True)
    assert z2.ended is None and z2.messages[-1]["content"] == "half an answ"
    assert z2.unfinished == 1 and z.unfinished == 0  # the kept answer is counted as cut


def test_thinking_is_stripped_on_request():
    think = Scripted(lambda msgs: Generation("<think>hmm</think>\n\n42", 5, True))
    keep, strip = Work("k", "k", [], ["q"]), Work("s", "s", [], ["q"])
    synthesize(think, [keep], SAMPLING, SAMPLING)
    synthesize(think, [strip], SAMPLING, SAMPLING, keep_thinking=False)
    assert keep.messages[-1]["content"] == "<think>hmm</think>\n\n42" and strip.messages[-1]["content"] == "42"


def test_magpie_user_turns_use_the_template_prefix_and_drop_duplicates(tokenizer):
    prompts = iter(["  Tell me about owls.\n", "tell me about OWLS.", "Why is the sky blue?", ""])

    def complete(request):
        assert request.prefix.endswith("<|im_start|>user\n") and request.stop == ("<|im_end|>",)
        return Generation(next(prompts), 6, True)

    works = [Work(f"m{i}", f"m{i}", [], [None]) for i in range(4)]
    seen = set()
    synthesize(
        Scripted(lambda m: Generation("Sure.", 2, True), complete),
        works,
        SAMPLING,
        SAMPLING,
        tokenizer=tokenizer,
        seen_users=seen,
    )
    assert works[0].messages == [
        {"role": "user", "content": "Tell me about owls."},
        {"role": "assistant", "content": "Sure."},
    ]
    assert [w.ended for w in works] == [None, "duplicate", None, "empty"]
    assert seen == {"tell me about owls.", "why is the sky blue?"}


def test_stable_seed():
    assert stable_seed(0, "a/a0") == stable_seed(0, "a/a0") != stable_seed(1, "a/a0")
    assert 0 <= stable_seed(7, "x") < 2**31
