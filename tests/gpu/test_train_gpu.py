"""GPU checks of training (run with --run-gpu): the compiled flex_attention TTT backend gives the
eager backend's loss and gradients, a 32k-token packed row trains within memory, and the
compiled static step (--compile-step) gives the default step's values, compiles once and keeps
its memory."""

from __future__ import annotations

import pytest
import torch

from draftsmith.draft.model import DrafterConfig, Eagle3Drafter
from draftsmith.runtime.head import OutputHead
from draftsmith.train.loss import TTTObjective
from draftsmith.train.ttt import doc_and_positions

pytestmark = pytest.mark.gpu


def _objective(
    backend: str, hidden: int = 576, vocab: int = 49152, draft: int = 32000, static: bool = False, num_layers: int = 1
) -> TTTObjective:
    torch.manual_seed(0)
    cfg = DrafterConfig(
        hidden_size=hidden,
        intermediate_size=1536,
        num_attention_heads=9,
        num_key_value_heads=3,
        head_dim=64,
        vocab_size=vocab,
        draft_vocab_size=draft,
        target_hidden_size=hidden,
        aux_layer_ids=[2, 15, 27],
        num_layers=num_layers,
    )
    d = Eagle3Drafter(cfg)
    d.t2d[:draft] = True
    w = torch.randn(vocab, hidden) * 0.05
    return TTTObjective(d.cuda(), OutputHead(w.cuda()), ttt=7, backend=backend, static=static)


def _batch(T: int, lengths: list[int], hidden: int = 576) -> dict[str, torch.Tensor]:
    torch.manual_seed(1)
    doc, pos = doc_and_positions(lengths, T, "cuda")
    ids = torch.randint(0, 49152, (1, T), device="cuda")
    return {
        "ids": ids,
        "loss_mask": torch.ones_like(ids),
        "doc": doc[None],
        "pos": pos[None],
        "aux": torch.randn(1, T, 3 * hidden, device="cuda"),
        "final": torch.randn(1, T, hidden, device="cuda") * 3,
    }


def test_flex_matches_eager_loss_and_grads():
    batch = _batch(512, [200, 150, 100])
    grads = {}
    for backend in ("eager", "flex"):
        obj = _objective(backend)
        loss, _ = obj(**batch)
        loss.backward()
        grads[backend] = (loss.item(), obj.drafter.midlayer.self_attn.q_proj.weight.grad.clone())
    assert grads["eager"][0] == pytest.approx(grads["flex"][0], rel=1e-3)
    torch.testing.assert_close(grads["eager"][1], grads["flex"][1], rtol=2e-2, atol=1e-4)


def test_32k_row_trains_without_oom():
    obj = _objective("flex")
    torch.cuda.reset_peak_memory_stats()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss, _ = obj(**_batch(32768, [32768]))
    loss.backward()
    peak = torch.cuda.max_memory_allocated() / 2**30
    assert torch.isfinite(loss) and peak < 100, peak


@pytest.mark.parametrize("num_layers", [1, 2])
def test_compiled_static_step_matches_the_compacted_step(num_layers):
    """--compile-step on CUDA: the static step, compiled whole with flex inside, gives the default
    step's loss, counts and gradients (fp32, padded row of several samples); with --num-layers 2
    too (each layer's TTT attention in the compiled region; the last layer's gradient compared)."""
    batch = _batch(1024, [400, 300, 200])
    batch["loss_mask"][:, ::3] = 0
    out = {}
    for static in (False, True):
        obj = _objective("flex", static=static, num_layers=num_layers)
        loss, stats = obj(**batch)
        loss.backward()
        d = obj.drafter
        out[static] = (
            loss.item(),
            stats,
            d.decoder_layers[-1].self_attn.q_proj.weight.grad.clone(),
            d.lm_head.weight.grad.clone(),
        )
    (loss, stats, g_q, g_head), (s_loss, s_stats, s_q, s_head) = out[False], out[True]
    assert s_loss == pytest.approx(loss, rel=1e-4)
    assert torch.equal(s_stats["n_valid"], stats["n_valid"]) and torch.equal(s_stats["n_chain"], stats["n_chain"])
    torch.testing.assert_close(s_stats["n_correct"], stats["n_correct"], atol=2, rtol=0)
    torch.testing.assert_close(s_q, g_q, rtol=1e-3, atol=1e-5)
    torch.testing.assert_close(s_head, g_head, rtol=1e-3, atol=1e-5)


def test_compiled_static_step_8k_memory_and_no_recompile():
    """At 8k-token rows under autocast, the compiled static step compiles once (a second row of
    other samples reuses it, and so does a validation row, run as `Trainer.validate` runs it: eval
    mode, gradients on) and peaks at no more memory than the compacted step, give or take a
    quarter (the vocab-sized part stays chunked)."""
    peaks = {}
    for static in (False, True):
        obj = _objective("flex", static=static)
        for i, lengths in enumerate(([3000, 2500, 2000], [4000, 1000, 1000, 1500])):
            torch.cuda.reset_peak_memory_stats()
            with (
                torch.autocast("cuda", dtype=torch.bfloat16),
                torch._dynamo.config.patch(error_on_recompile=static and i > 0),
            ):
                loss, _ = obj(**_batch(8192, lengths))
            loss.backward()
            obj.drafter.zero_grad(set_to_none=True)
            peaks[static] = torch.cuda.max_memory_allocated() / 2**30
    assert peaks[True] <= 1.25 * peaks[False], peaks
    obj.eval()
    with (
        torch.no_grad(),
        torch.enable_grad(),
        torch.autocast("cuda", dtype=torch.bfloat16),
        torch._dynamo.config.patch(error_on_recompile=True),
    ):
        stats = obj(**_batch(8192, [5000, 3192]))[1]
    # the walk ran (a random drafter on random rows has no draft accepted, so no walk_reach)
    assert stats["walk_cycles"].sum() > 0


def test_flex_capture_gives_the_dense_capture_states(tmp_path):
    """--capture-attention flex on CUDA (bf16, compiled flex kernels, a row padded to FLEX_WIDTH)
    captures each packed sample's states as sdpa's dense packed mask does, within bf16's
    tolerance, and leaves the model's own attention in place after it; a second row of other
    lengths reuses the compiled kernels. --compile-capture (the forward compiled, rows at one
    width) captures the same states."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from draftsmith.data.dataset import load_dataset
    from draftsmith.train.batching import OnlineSource
    from tests.helpers import write_tokenized_dataset

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=1024,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        attn_implementation="sdpa",
    )
    model = LlamaForCausalLM(cfg).cuda().to(torch.bfloat16).eval().requires_grad_(False)
    lengths = [300, 41, 700, 129, 512, 90, 333]

    g = torch.Generator().manual_seed(1)
    data = load_dataset(
        write_tokenized_dataset(tmp_path / "ds", [torch.randint(3, 1024, (n,), generator=g).tolist() for n in lengths])
    )
    dense = OnlineSource(data, model, [1, 2, 4], max_len=2048, token_budget=4096)
    flex = OnlineSource(data, model, [1, 2, 4], max_len=2048, token_budget=4096, attention="flex_attention")
    compiled = OnlineSource(
        data, model, [1, 2, 4], max_len=2048, token_budget=4096, attention="flex_attention", compile=True
    )
    assert dense.packed and flex.packed
    for row in ([0, 1, 2], [3, 4, 5, 6]):
        with torch._dynamo.config.patch(error_on_recompile=row[0] > 0):
            got = flex.samples(row)
        for a, b, c in zip(dense.samples(row), got, compiled.samples(row), strict=True):
            for key in ("aux", "final"):
                for x in (b, c):
                    torch.testing.assert_close(
                        x[key].float(), a[key].float(), rtol=5e-2, atol=5e-2 * a[key].float().abs().max().item()
                    )
    assert model.config._attn_implementation == "sdpa"
