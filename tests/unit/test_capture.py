"""Hook capture equals HF's output_hidden_states (the reference) on a tiny model; the compiled
capture of packed rows equals the hook capture."""

import pytest
import torch

from draftsmith.runtime.capture import CompiledCapture, capture, packed_positions
from draftsmith.target import decoder_layers, final_norm


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
def test_compiled_capture_equals_capture_and_compiles_once(tiny_model, attention):
    """CompiledCapture (train --compile-capture) gives `capture`'s states for packed rows of other
    packings than the one it was compiled on, without compiling again; after each row its hooks
    are gone and the model has its own attention implementation back."""
    aux_layer_ids = [0, 1, 2]
    own = tiny_model.config._attn_implementation
    compiled = CompiledCapture(tiny_model, aux_layer_ids, attention)
    frames = torch._dynamo.utils.counters["frames"]
    torch.manual_seed(0)
    for j, lengths in enumerate([[10, 20, 34], [40, 24], [64]]):  # one width, three packings
        ids = torch.randint(3, 1000, (1, 64))
        pos = packed_positions(lengths)[None]  # [1, 64]
        before = frames["total"]
        got = compiled(ids, pos)
        assert j == 0 or frames["total"] == before, "a new packing compiled again"
        want = capture(tiny_model, ids, None, aux_layer_ids, pos, attention)
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-4)
        hooked_modules = [*decoder_layers(tiny_model), final_norm(tiny_model)]
        assert not any(m._forward_pre_hooks for m in hooked_modules)
        assert tiny_model.config._attn_implementation == own
        assert not compiled.captured  # emptied after each row
