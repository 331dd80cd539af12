"""LoRA dropout on CPU with a mask from 31 random bits per element: the same distribution, at less cost.

torch's CPU dropout draws its mask with `bernoulli_`, a double from the default generator per element: 2.9 ms for
a [4, 256, 576] input on this project's 2-core machine, and SmolLM2-135M's q, k, v and o draw 120 masks a step,
9-13% of a step (bench/README.md). `MaskDropout` compares one 31-bit `random_` integer per element with a
threshold (1.2 ms; the same default generator, so `torch.manual_seed` and the checkpointed RNG state still fix
it): P(keep) = 1 - p within 2**-32. On CUDA torch's fused dropout is already fast; it stays there.
"""

from __future__ import annotations

from typing import Any

import torch

DRAWS = 2**31  # int32 random_() is uniform over [0, 2**31)


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
        draws = torch.empty(x.shape, dtype=torch.int32, device=x.device).random_()
        keep = (draws >= self.threshold).to(x.dtype)
        return x * keep.mul_(1.0 / (1.0 - self.p))

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
