import pytest

from draftsmith.errors import UserError
from draftsmith.layers import default_aux_layers, from_engine, to_engine, validate_layers


def test_default_aux_layers_match_eagle_vllm_sglang_default():
    assert default_aux_layers(30) == [2, 15, 27]  # SmolLM2-135M
    assert default_aux_layers(61) == [2, 30, 58]  # the 1T MoE of the anchor story
    assert default_aux_layers(2) == [0, 1, 2]  # tiny test models: distinct ids


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
        validate_layers([2, 31], 30)
    with pytest.raises(UserError, match="duplicates"):
        validate_layers([2, 2], 30)
    assert validate_layers([27, 2, 15], 30) == [2, 15, 27]
