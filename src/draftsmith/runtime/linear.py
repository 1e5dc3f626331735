"""Linear layers for decoding on CPU: oneDNN over weights prepacked once.

PyTorch's CPU `F.linear` (MKL sgemm) repacks the weight on every call, and for a few rows that
costs more than the product itself; oneDNN's linear over a weight reordered once does not, and
row 0 of its few-row product is bitwise its one-row one (figures: experiments/LOG.md, CPU
figures, 2026-12-01 12:37).

`prepacked(module)` is `module` with every `nn.Linear` inside it running that way: a shallow
copy that shares every parameter and leaves `module` untouched (the target engine's layers and
lm_head, the drafter of eval's proposer). Only float32 on a CPU with oneDNN is packed; anything
else (GPU, bf16) gets `module` itself. The packed weights are a second copy of the weights, for
as long as the copy lives; they are read when the copy is made, so make it after any change to
the weights.

`fused_linear(module, names)` is several of `module`'s linear layers as one product (the target
engine's `fuse`: q/k/v, gate/up): their weights concatenated, and theirs made views of that
tensor, so the model holds them once.
"""

from __future__ import annotations

import copy

import torch
from torch import nn


def can_prepack(weight: torch.Tensor) -> bool:
    """float32 weights on a CPU with oneDNN."""
    return weight.device.type == "cpu" and weight.dtype == torch.float32 and torch.backends.mkldnn.is_available()


class PackedLinear(nn.Module):
    """`linear`'s forward through its weight reordered once for oneDNN (the same parameters)."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias  # [out, in], [out] or None: shared
        self.packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., in] -> [..., out]."""
        bias = None if self.bias is None else self.bias.detach()
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, bias, "none", [], "")


def prepacked(module: nn.Module) -> nn.Module:
    """`module` with its nn.Linear layers as `PackedLinear` where `can_prepack`: a shallow copy
    of every module on the way to one (the rest, and all parameters, shared); `module` itself
    where none is packed."""
    if isinstance(module, nn.Linear):
        return PackedLinear(module) if can_prepack(module.weight) else module
    children = {name: prepacked(child) for name, child in module.named_children()}
    if all(children[name] is child for name, child in module.named_children()):
        return module
    clone = copy.copy(module)  # its __dict__ copied: the parameter and buffer dicts still shared
    clone._modules = {**module._modules, **children}
    return clone


def fused_linear(module: nn.Module, names: tuple[str, ...]) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """The linear layers `names` of `module` as one: (weight [sum out, in], bias or None), theirs
    concatenated, each layer's own weight and bias then a view of its rows (one copy in memory;
    the values unchanged); None where one is missing or not a linear layer (an nn.Linear or a
    PackedLinear; not a subclass, such as a quantised layer, whose weight is not the product's),
    where their weights differ in dtype or device, where biases differ in presence, or where an
    MLP has no act_fn."""
    parts = [getattr(module, n, None) for n in names]
    if not all(type(p) in (nn.Linear, PackedLinear) for p in parts):
        return None
    if len({(p.weight.dtype, p.weight.device, p.bias is None) for p in parts}) != 1:
        return None
    if "gate_proj" in names and not callable(getattr(module, "act_fn", None)):
        return None
    weight = torch.cat([p.weight.detach() for p in parts])
    bias = None if parts[0].bias is None else torch.cat([p.bias.detach() for p in parts])
    rows = [p.weight.shape[0] for p in parts]
    for p, w in zip(parts, weight.split(rows), strict=True):
        p.weight.data = w  # [out_p, in]: contiguous rows of the fused weight
    if bias is not None:
        for p, b in zip(parts, bias.split(rows), strict=True):
            p.bias.data = b
    return weight, bias
