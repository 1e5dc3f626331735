import pytest

from draftsmith.errors import UserError
from draftsmith.layers import default_aux_layers, from_engine, resolve_aux_layers, to_engine, validate_layers


def test_default_aux_layers_match_eagle_vllm_sglang_default():
    assert default_aux_layers(30) == [2, 15, 27]  # SmolLM2-135M
    assert default_aux_layers(61) == [2, 30, 58]  # the 1T MoE of the anchor story
    assert default_aux_layers(2) == [0, 1, 2]  # tiny test models: distinct ids
    assert default_aux_layers(5) == [1, 2, 4]  # and, where there are three, ids the engines capture
    for n in range(2, 64):
        assert validate_layers(default_aux_layers(n), n) == default_aux_layers(n)
        assert resolve_aux_layers(None, n) == resolve_aux_layers([], n) == default_aux_layers(n)


def test_resolve_aux_layers_checks_the_ids_given():
    assert resolve_aux_layers([27, 2, 15], 30) == [2, 15, 27]
    with pytest.raises(UserError, match="out of range"):
        resolve_aux_layers([2, 15, 30], 30)


def test_sglang_is_one_lower_and_round_trips():
    ours = [2, 30, 58]
    assert to_engine(ours, "vllm") == [2, 30, 58]
    assert to_engine(ours, "sglang") == [1, 29, 57]
    for engine in ("vllm", "sglang", "eagle", "draftsmith"):
        assert from_engine(to_engine(ours, engine), engine) == ours


def test_unknown_engine_and_out_of_range():
    with pytest.raises(UserError, match="unknown engine"):
        to_engine([1], "tensorrt")
    with pytest.raises(UserError, match="out of range"):
        validate_layers([2, 15, 31], 30)
    with pytest.raises(UserError, match="duplicates"):
        validate_layers([2, 2, 15], 30)
    assert validate_layers([27, 2, 15], 30) == [2, 15, 27]


@pytest.mark.parametrize(
    "ids,match",
    [
        ([2, 15], "exactly 3"),
        ([2, 15, 20, 27], "exactly 3"),
        ([0, 15, 27], "id 0 \\(the embeddings\\).*never captured"),
        ([2, 15, 30], "must be in 1..29"),
        ([-1, 2, 3], "count from 0"),
    ],
)
def test_ids_the_engines_cannot_serve_are_refused(ids, match):
    """One check for extract, train, eval and export: three ids that vLLM and SGLang capture."""
    with pytest.raises(UserError, match=match):
        validate_layers(ids, 30)


def test_a_toy_target_may_use_its_embeddings_and_last_layer():
    assert validate_layers([0, 1, 2], 2) == [0, 1, 2]
    with pytest.raises(UserError, match="must be in 0..2"):
        validate_layers([0, 1, 3], 2)
    with pytest.raises(UserError, match="must be in 1..L-1"):
        validate_layers([0, 15, 29], None)  # a drafter without its target's record
