"""draftsmith's Muon is torch.optim.Muon with the orthogonalisation's dtype chosen per device:
in bfloat16 it takes torch's steps exactly, its state loads in torch's optimizer, and on CPU it
orthogonalises in float32 (torch's bf16 cast took 26 s per quickstart step on a CPU without bf16
matrix units)."""

from __future__ import annotations

import pytest
import torch

from draftsmith.train.optim import Muon, Optimizers, orthogonalize

OPTIONS = {"lr": 0.02, "weight_decay": 0.1, "adjust_lr_fn": "match_rms_adamw"}


def _params() -> list[torch.nn.Parameter]:
    torch.manual_seed(0)
    return [torch.nn.Parameter(torch.randn(24, 40)), torch.nn.Parameter(torch.randn(48, 16))]  # wide and tall


def _steps(opt: torch.optim.Optimizer, params: list[torch.nn.Parameter], n: int = 3) -> None:
    gen = torch.Generator().manual_seed(1)
    for _ in range(n):
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen)
        opt.step()


@pytest.mark.parametrize("adjust_lr_fn", ["match_rms_adamw", "original"])
def test_in_bf16_it_takes_torchs_steps_exactly(adjust_lr_fn):
    ours, theirs = _params(), _params()
    opt = Muon(ours, ns_dtype=torch.bfloat16, **(OPTIONS | {"adjust_lr_fn": adjust_lr_fn}))
    _steps(opt, ours)
    _steps(torch.optim.Muon(theirs, **(OPTIONS | {"adjust_lr_fn": adjust_lr_fn})), theirs)
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_its_state_is_torchs():
    ours, theirs = _params(), _params()
    opt = Muon(ours, **OPTIONS)
    _steps(opt, ours, n=1)
    torch_opt = torch.optim.Muon(theirs, **OPTIONS)
    torch_opt.load_state_dict(opt.state_dict())  # a checkpoint written by either loads in the other
    torch.testing.assert_close(torch_opt.state[theirs[0]]["momentum_buffer"], opt.state[ours[0]]["momentum_buffer"])


def test_on_cpu_it_orthogonalises_in_fp32():
    ours, bf16 = _params(), _params()
    _steps(Muon(ours, **OPTIONS), ours)  # ns_dtype unset: float32 on CPU
    _steps(Muon(bf16, ns_dtype=torch.bfloat16, **OPTIONS), bf16)
    for a, b in zip(ours, bf16, strict=True):
        assert not torch.equal(a, b)  # another dtype, so not torch's bf16 path
        torch.testing.assert_close(a, b, rtol=0.05, atol=0.02)  # the same steps up to bf16 rounding
    g = torch.randn(24, 40)
    x = orthogonalize(g, (3.4445, -4.7750, 2.0315), 5, 1e-7, torch.float32)
    assert x.dtype == torch.float32 and x.shape == g.shape
    s = torch.linalg.svdvals(x)
    assert s.min() > 0.5 and s.max() < 1.3  # singular values pushed towards 1 (not exactly: see Muon)


def test_optimizers_use_it_for_the_hidden_matrices():
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8))
    opts = Optimizers(model, "muon", 1e-3, 0.0, "cosine", total=10, warmup=1)
    assert isinstance(opts.optimizers[0], Muon) and isinstance(opts.optimizers[1], torch.optim.AdamW)
    assert [p.ndim for p in opts.optimizers[0].param_groups[0]["params"]] == [2]
