"""The training teacher is the target's own output path (runtime/head.py): Granite's logit
scaling, Gemma-2's soft-capping, Cohere's logit scale and an lm_head bias are applied, checked
against `model(ids).logits`, and carried into the teacher's logits on the draft vocab; a model
whose forward does something unknown to its logits is refused by `train`, with no output."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers import LlamaForCausalLM

from draftsmith.errors import UserError
from draftsmith.runtime.head import OutputHead, check_output_head, output_head
from draftsmith.target import base_model, shared_targets, target_from_model
from draftsmith.train.loss import teacher_table
from tests.helpers import make_tiny_llama, tiny_causal_lm, write_tokenized_dataset


def with_bias(model: nn.Module) -> nn.Module:
    """`model` with an lm_head that has a (large, random) bias."""
    w = model.get_output_embeddings().weight
    head = nn.Linear(w.shape[1], w.shape[0], bias=True)
    with torch.no_grad():
        head.weight.copy_(w)
        head.bias.copy_(torch.randn(w.shape[0], generator=torch.Generator().manual_seed(0)))
    model.lm_head = head
    return model


MODELS = {
    "granite": lambda: tiny_causal_lm("granite"),
    "gemma2": lambda: tiny_causal_lm("gemma2"),
    "cohere": lambda: tiny_causal_lm("cohere"),
    "bias": lambda: with_bias(make_tiny_llama(300)),
}


@pytest.mark.parametrize("name", MODELS)
def test_the_check_passes_with_the_transform_and_fails_without(name):
    model = MODELS[name]()
    head = output_head(model)
    check_output_head(model, head)
    plain = OutputHead(head.weight)  # final @ lm_headᵀ alone: the teacher before issue 18
    with pytest.raises(
        UserError, match=f"{type(model).__name__}: its logits are not final @ lm_headᵀ of its final hidden state"
    ):
        check_output_head(model, plain)


@pytest.mark.parametrize("name", MODELS)
def test_teacher_logits_are_the_models_own_on_the_draft_rows(name):
    model = MODELS[name]()
    ids = torch.randint(3, 300, (1, 12), generator=torch.Generator().manual_seed(1))
    final = base_model(model)(input_ids=ids).last_hidden_state[0]  # [T, H]
    draft_ids = torch.arange(0, 300, 3)  # [Vd]
    teacher = teacher_table(final, output_head(model).rows(draft_ids), chunk=5)
    ref = model(ids).logits[0][:, draft_ids]  # [T, Vd]
    torch.testing.assert_close(teacher.logits, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(teacher.lse, torch.logsumexp(ref, -1))


class Doubled(LlamaForCausalLM):
    """A Llama whose forward doubles its logits: an output path draftsmith does not know."""

    def forward(self, *args, **kwargs):
        out = super().forward(*args, **kwargs)
        out.logits = 2 * out.logits
        return out


def test_train_refuses_an_unknown_output_path_and_leaves_nothing(tmp_path, tokenizer):
    from draftsmith.train.config import TrainConfig
    from draftsmith.train.run import run

    folder = tmp_path / "target"
    plain = make_tiny_llama(len(tokenizer))
    plain.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    doubled = Doubled(plain.config)
    doubled.load_state_dict(plain.state_dict())
    ds = write_tokenized_dataset(tmp_path / "ds", [list(range(3, 30))] * 4)
    with shared_targets(target_from_model(doubled, tokenizer, name=str(folder))):
        with pytest.raises(UserError, match="Doubled: its logits are not .* not supported for training"):
            run(
                TrainConfig(
                    dataset_dir=ds, target=str(folder), out=tmp_path / "run", device="cpu", dtype="fp32", steps=1
                )
            )
    assert not (tmp_path / "run").exists()
