"""Hook capture equals HF's output_hidden_states (the reference) on a tiny model; the compiled
capture of packed rows equals the hook capture."""

import pytest
import torch

from draftsmith.runtime.capture import CompiledCapture, capture, packed_positions
from draftsmith.target import decoder_layers, final_norm
from tests.helpers import make_tiny_llama


def test_capture_equals_output_hidden_states(tiny_model):
    torch.manual_seed(0)
    ids = torch.randint(0, 1000, (2, 17))
    mask = torch.ones_like(ids)
    mask[1, 12:] = 0  # right padding on the second row
    aux_layer_ids = [0, 1, 2]
    aux, final = capture(tiny_model, ids, mask, aux_layer_ids)
    ref = tiny_model(ids, attention_mask=mask, output_hidden_states=True)
    hs = ref.hidden_states  # L+1 entries; the last is after the final norm in HF
    H = tiny_model.config.hidden_size
    assert aux.shape == (2, 17, 3 * H) and final.shape == (2, 17, H)
    for j, k in enumerate(aux_layer_ids[:-1]):
        torch.testing.assert_close(aux[..., j * H : (j + 1) * H], hs[k])
    torch.testing.assert_close(final, hs[-1])
    # id L = the input of the final norm: norm(aux_L) == final
    norm = tiny_model.model.norm
    torch.testing.assert_close(norm(aux[..., 2 * H :]), final)


@pytest.mark.slow
@pytest.mark.parametrize("attention", [None, "flex_attention"])
def test_compiled_capture_equals_capture_and_compiles_once(attention):
    """CompiledCapture (train --compile-capture) gives `capture`'s states for packed rows of other
    packings than the one it was compiled on, compiling one graph for all the layers and none
    again; after each row its hooks are gone and the layers and the attention implementation are
    the model's own again."""
    tiny_model = make_tiny_llama(1000, num_layers=5)
    aux_layer_ids = [0, 2, 5]
    own = tiny_model.config._attn_implementation
    compiled = CompiledCapture(tiny_model, aux_layer_ids, attention)
    frames = torch._dynamo.utils.counters["frames"]
    torch.manual_seed(0)
    compiles = []
    for lengths in [[10, 20, 34], [40, 24], [64], [30, 34], [64]]:  # one width, four packings
        ids = torch.randint(3, 1000, (1, 64))
        pos = packed_positions(lengths)[None]  # [1, 64]
        before = frames["total"]
        got = compiled(ids, pos)
        compiles.append(frames["total"] - before)
        want = capture(tiny_model, ids, None, aux_layer_ids, pos, attention)
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-4)
        hooked_modules = [*decoder_layers(tiny_model), final_norm(tiny_model)]
        assert not any(m._forward_pre_hooks for m in hooked_modules)
        assert tiny_model.config._attn_implementation == own
        assert not any("forward" in layer.__dict__ for layer in decoder_layers(tiny_model))  # their own forward
    # one graph for the 5 layers of a packed row, one for a row of one sample (no packed mask), and no other
    n = 1 if attention is None else 2  # flex: its own compiled frame beside the layers'
    assert compiles == [n, 0, n, 0, 0]
