"""runtime/linear.py: a model's linear layers over prepacked oneDNN weights, as a shallow copy."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from draftsmith.runtime.linear import PackedLinear, can_prepack, prepacked
from tests.helpers import make_tiny_llama

needs_onednn = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="PyTorch built without oneDNN")


@needs_onednn
def test_a_packed_layer_computes_the_model_s_layer_and_leaves_the_model_alone():
    model = make_tiny_llama(vocab_size=32)
    layer = model.model.layers[0]
    packed = prepacked(layer)
    assert isinstance(packed.self_attn.q_proj, PackedLinear) and isinstance(packed.mlp.down_proj, PackedLinear)
    assert isinstance(layer.self_attn.q_proj, nn.Linear) and isinstance(layer.mlp.down_proj, nn.Linear)  # untouched
    assert packed.input_layernorm is layer.input_layernorm  # modules without a linear layer: shared
    assert packed.self_attn.q_proj.weight is layer.self_attn.q_proj.weight  # parameters: shared
    x = torch.randn(2, 5, 64)  # [B, T, H]
    with torch.no_grad():
        for name in ("q_proj", "k_proj", "o_proj"):
            ours, ref = getattr(packed.self_attn, name)(x), getattr(layer.self_attn, name)(x)
            torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(packed.mlp(x), layer.mlp(x), rtol=1e-5, atol=1e-5)


@needs_onednn
def test_a_row_s_output_does_not_depend_on_the_rows_beside_it():
    """Verification's rows after the first do not change the first: a token verified beside its
    draft gets the logits of plain decoding, bit for bit."""
    torch.manual_seed(0)
    linear = PackedLinear(nn.Linear(576, 1536, bias=True))
    x = torch.randn(1, 4, 576)  # [B, T, in]
    with torch.no_grad():
        assert torch.equal(linear(x)[:, :1], linear(x[:, :1]))


def test_nothing_to_pack_gives_the_module_itself():
    model = make_tiny_llama(vocab_size=32).to(torch.bfloat16)
    assert not can_prepack(model.lm_head.weight)
    assert prepacked(model.model) is model.model
