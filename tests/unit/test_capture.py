"""Hook capture equals HF's output_hidden_states (the reference) on a tiny model."""

import torch

from draftsmith.runtime.capture import capture


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
