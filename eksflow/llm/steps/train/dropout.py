"""LoRA dropout on CPU from 15 random bits an element: nn.Dropout's distribution within 2**-16, at less cost.

torch's CPU dropout draws its mask with `bernoulli_`, a double from the default generator per element: 2.9 ms for
a [4, 256, 576] input on this project's 2-core machine, and SmolLM2-135M's q, k, v and o draw 120 masks a step,
9-13% of a step (bench/README.md). `MaskDropout` draws one 31-bit `random_` integer for every two elements and
compares two 15-bit fields of it with a threshold (1.0 ms against 1.8 ms for one integer per element; the same
default generator, so `torch.manual_seed` and the checkpointed RNG state still fix it): P(keep) = 1 - p within
2**-16. On CUDA torch's fused dropout is already fast; it stays there.
"""

from __future__ import annotations

from typing import Any

import torch

FIELD_BITS = 15  # int32 random_() is uniform over [0, 2**31): bits 0-14 and 16-30 are two independent draws
DRAWS = 2**FIELD_BITS
_LOW = DRAWS - 1


class MaskDropout(torch.nn.Module):
    """`torch.nn.Dropout(p)` in training and evaluation, with its mask from `random_` integers, not `bernoulli_`."""

    def __init__(self, p: float) -> None:
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout probability must be in [0, 1), got {p}")
        self.p = p
        self.threshold = round(p * DRAWS)  # a draw below it drops its element

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Zero each element of `x` with probability p and scale the rest by 1 / (1 - p) (in training only)."""
        if not self.training or self.p == 0.0:
            return x
        count = x.numel()
        fields = (count + 1) // 2
        draws = torch.empty(fields, dtype=torch.int32, device=x.device).random_()
        keep = torch.empty(2 * fields, dtype=torch.bool, device=x.device)
        torch.ge(draws.bitwise_and(_LOW), self.threshold, out=keep[:fields])
        torch.ge(draws.bitwise_right_shift(FIELD_BITS + 1), self.threshold, out=keep[fields:])
        scale = torch.where(keep[:count].view(x.shape), x.new_tensor(1.0 / (1.0 - self.p)), x.new_tensor(0.0))
        return x * scale

    def extra_repr(self) -> str:
        """As nn.Dropout prints."""
        return f"p={self.p}"


def use_mask_dropout(model: Any) -> int:
    """Replace every `nn.Dropout` of the LoRA layers of a peft `model` by a MaskDropout of the same p; the count."""
    replaced = 0
    for module in model.modules():
        layers = getattr(module, "lora_dropout", None)
        if not isinstance(layers, torch.nn.ModuleDict):
            continue
        for name, layer in layers.items():
            if type(layer) is torch.nn.Dropout:
                layers[name] = MaskDropout(layer.p)
                replaced += 1
    return replaced
