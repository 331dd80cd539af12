"""The frozen projections on an x86 CPU in fp32: oneDNN's matmul, forward and backward, instead of MKL's sgemm.

torch's CPU `linear` and `mm` in fp32 call the BLAS it was built with (MKL in the PyPI wheels); its oneDNN, which
torch already uses for bf16, runs the same fp32 products faster at this model's shapes. On this project's 2-core AMD
EPYC, two threads, per product: the MLP's 1,024 x 576 -> 1,536 8.4 ms against 9.8 forward and 8.0 against 9.2
backward, the vocabulary projection 311 ms against 355 forward; the benchmark's whole SmolLM2-135M step 1.06x
(bench/README.md). `use_onednn_linears` routes the frozen `nn.Linear` layers of a model (the base model's projections
and the tied vocabulary head; the LoRA weights, which train, keep torch's own) through `FrozenLinear`: the same
function, y = x W^T + b, summed in another order.
"""

from __future__ import annotations

import platform
from typing import Any

import torch

_X86 = {"x86_64", "amd64"}


def _product(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The product x W^T + b over x's last dimension, by oneDNN's fp32 matmul (`weight` may be a strided view)."""
    rows = x.reshape(-1, x.shape[-1])
    y: torch.Tensor = torch.ops.mkldnn._linear_pointwise(rows, weight, bias, "none", [], "")
    return y.reshape(*x.shape[:-1], weight.shape[0])


class _FrozenLinear(torch.autograd.Function):
    """y = x W^T + b through oneDNN, and the input's gradient grad_y W through it too; W and b get none."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        ctx.save_for_backward(weight)
        return _product(x, weight, bias)

    @staticmethod
    def backward(ctx: Any, grad_y: torch.Tensor) -> tuple[torch.Tensor | None, None, None]:
        if not ctx.needs_input_grad[0]:
            return None, None, None
        (weight,) = ctx.saved_tensors
        return _product(grad_y, weight.t(), None), None, None  # W^T as a view: a copy measured no faster


class FrozenLinear(torch.nn.Linear):
    """An `nn.Linear` whose weight and bias do not train, computed by oneDNN in fp32 (`use_onednn_linears`)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The product x W^T + b; the input's gradient flows back, the layer's own parameters get none."""
        if x.dtype != torch.float32 or x.device.type != "cpu":
            return super().forward(x)
        return _FrozenLinear.apply(x, self.weight, self.bias)  # type: ignore[no-any-return]


def onednn_available() -> bool:
    """Whether this torch computes fp32 linears through oneDNN here: an x86 CPU and a build with oneDNN."""
    return (
        platform.machine().lower() in _X86
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    )


def use_onednn_linears(model: Any) -> int:
    """Make every plain `nn.Linear` of `model` whose parameters all are frozen a FrozenLinear; the count.

    The layer keeps its parameters and state-dict keys (only its class changes), so checkpoints and the adapter's
    export are unaffected. Nothing changes where oneDNN is not available (`onednn_available`).
    """
    if not onednn_available():
        return 0
    replaced = 0
    for module in model.modules():
        if type(module) is torch.nn.Linear and not any(p.requires_grad for p in module.parameters()):
            module.__class__ = FrozenLinear
            replaced += 1
    return replaced
