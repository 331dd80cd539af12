"""The training loss: mean cross-entropy of the learned positions' logits, in fp32, with a backward that reuses them.

`torch.nn.functional.cross_entropy` on [tokens, vocabulary] logits makes a log-softmax copy forward, and backward
a zero-filled gradient for the NLL plus one more pass for the log-softmax: each a pass over a tensor of 881 x 49,152
floats (173 MB) in a SmolLM2-135M step of the benchmark's shape. `learned_token_loss` keeps only the fp32 logits
and a log-sum-exp per row, and backward turns those logits into the gradient in place: softmax minus the one-hot
target, over the number of rows. The same loss and gradient as `cross_entropy(logits.float(), targets)` within
float rounding (tests/unit/steps/test_train_compute.py); 0.13 s against 0.04 s for the loss's forward and
backward at that shape on 2 cores.
"""

from __future__ import annotations

from typing import Any

import torch


class _LearnedTokenLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        # float() copies bf16 logits; fp32 logits are the lm_head's output, which no other node saves (autograd's
        # version check would refuse the in-place backward if one did).
        scores = logits.float()
        log_norm = torch.logsumexp(scores, dim=-1)
        loss = (log_norm - scores.gather(1, targets[:, None]).squeeze(1)).mean()
        ctx.save_for_backward(scores, log_norm, targets)
        ctx.input_dtype = logits.dtype
        return loss

    @staticmethod
    def backward(ctx: Any, grad_loss: torch.Tensor) -> tuple[torch.Tensor, None]:
        scores, log_norm, targets = ctx.saved_tensors
        grad = scores.sub_(log_norm[:, None]).exp_()  # softmax
        grad.scatter_add_(1, targets[:, None], grad.new_full((targets.shape[0], 1), -1.0))
        grad.mul_(grad_loss / targets.shape[0])
        return grad.to(ctx.input_dtype), None


def learned_token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of `logits` [rows, vocabulary] (fp32 or bf16) against `targets` [rows], computed in fp32.

    A micro-batch whose every completion was cut off by max_seq_len has no row: its loss is 0 with a zero gradient
    (the mean of nothing would be NaN, and one NaN gradient ruins the adapter), and it still runs backward, so that
    DDP's gradient all-reduce sees every rank.
    """
    if logits.shape[0] == 0:
        return logits.float().sum()
    return _LearnedTokenLoss.apply(logits, targets)  # type: ignore[no-any-return]


class SupervisedObjective:
    """One micro-batch's SFT loss (method sft): the loss transformers computes from labels.

    Logits at the learned positions only (data.MicroBatch), in fp32 (bf16 logits under autocast are upcast, as
    transformers does).
    """

    def __init__(self, model: Any) -> None:
        self.model = model  # what the loop calls: the DDP wrapper, the FSDP2 root or the DeepSpeed engine

    def __call__(self, batch: Any) -> tuple[torch.Tensor, dict[str, float]]:
        """(loss, no further metrics) of a micro-batch."""
        return learned_token_loss(self.model(**batch.inputs).logits, batch.targets), {}
