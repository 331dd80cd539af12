"""DPO's objective (method dpo): a preference loss of the policy's log-probabilities against the base model's.

A micro-batch of n preference pairs is 2n rows, the chosen sequences then the rejected ones (train/data.py). Each
row's log-probability is the sum, over its answer's learned tokens, of log p(token | what precedes it), under the
policy (the model with its adapter, with gradients) and under the reference: the same model with the adapter
disabled (peft's `disable_adapter()`, under torch.no_grad), never a second copy of the weights. Each answer's
implicit reward is beta * (logp_policy - logp_reference); with the margin m = (pc - rc) - (px - rx) (p: policy,
r: reference; c: chosen, x: rejected), the losses are TRL's (trl/trainer/dpo_trainer.py, `dpo_loss`):

    sigmoid   -log sigmoid(beta * m)                   Rafailov et al. 2023, eq. 7
    ipo       (m - 1 / (2 * beta))^2                   Azar et al. 2023, eq. 17; the log-probabilities are each
                                                       answer's mean over its learned tokens (TRL's
                                                       concatenated_forward divides by the answer's length for ipo)

A fresh adapter (LoRA's B is zero) is the reference: m = 0, and the sigmoid loss is log 2 at step 0.
With train.finetune=full every weight moves, so the reference is a frozen copy of the base instead (built once
per attempt in the worker's compute precision, eval mode, outside the strategy's wrapper: a replica per worker);
at step 0 the policy is that base, and the loss is log 2 likewise.

The reference forward runs through the same wrapper as the policy's (DDP, an FSDP2 root, a DeepSpeed engine), so
each strategy gathers or reads its weights the way its policy forward does; disable_adapter() only switches the
LoRA layers off (and their requires_grad, which it restores on leaving) before the policy forward and backward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.nn.functional import logsigmoid

from eksflow.llm.steps.train import DpoSettings


def sequence_logps(logits: torch.Tensor, targets: torch.Tensor, rows: torch.Tensor, n_rows: int) -> torch.Tensor:
    """Per row, the sum of log p(target) over its learned positions; logits [positions, vocabulary] in fp32.

    `rows` gives each position's row (data.MicroBatch.target_rows); a row with no learned position sums to 0.
    """
    scores = logits.float()
    picked = scores.gather(1, targets[:, None]).squeeze(1) - torch.logsumexp(scores, dim=-1)
    return torch.zeros(n_rows, dtype=picked.dtype, device=picked.device).index_add(0, rows, picked)


def learned_counts(rows: torch.Tensor, n_rows: int) -> torch.Tensor:
    """Learned tokens per row, at least 1 (an answer max_seq_len cut off entirely averages to 0, not NaN)."""
    return torch.bincount(rows, minlength=n_rows).clamp(min=1)


def preference_loss(
    policy: torch.Tensor, reference: torch.Tensor, settings: DpoSettings
) -> tuple[torch.Tensor, dict[str, float]]:
    """The mean loss over n pairs and its reward metrics, from per-row log-probabilities [2n] (chosen, then rejected).

    The metrics are TRL's rewards/chosen, rejected, margins and accuracies (named in the singular here), each a mean
    over the pairs.

    For ipo the log-probabilities given must already be length-normalized (`PreferenceObjective` does it).
    """
    n = policy.shape[0] // 2
    chosen_ratio = policy[:n] - reference[:n]
    rejected_ratio = policy[n:] - reference[n:]
    margin = chosen_ratio - rejected_ratio
    ipo = settings.loss == "ipo"
    losses = (margin - 1 / (2 * settings.beta)) ** 2 if ipo else -logsigmoid(settings.beta * margin)
    chosen = settings.beta * chosen_ratio.detach()
    rejected = settings.beta * rejected_ratio.detach()
    stats = {
        "rewards/chosen": float(chosen.mean()),
        "rewards/rejected": float(rejected.mean()),
        "rewards/margin": float((chosen - rejected).mean()),
        "rewards/accuracy": float((chosen > rejected).float().mean()),
    }
    return losses.mean(), stats


def unwrapped(model: Any) -> Any:
    """The peft model inside a DDP wrapper or a DeepSpeed engine (an FSDP2-sharded model is the peft model)."""
    from peft import PeftModel

    return model if isinstance(model, PeftModel) else model.module


@dataclass
class PreferenceObjective:
    """One micro-batch's DPO loss: the reference forward (adapter disabled, no gradients), then the policy's."""

    model: Any  # what the loop calls: the DDP wrapper, the FSDP2 root or the DeepSpeed engine
    settings: DpoSettings
    reference: Any = None  # a full fine-tune's frozen copy of the base (model.reference_model); None: LoRA's base

    def __call__(self, batch: Any) -> tuple[torch.Tensor, dict[str, float]]:
        """(loss, reward metrics) of a preference micro-batch (data.MicroBatch with target_rows)."""
        reference = self.reference_logps(batch)
        policy = self.logps(batch)
        if self.settings.loss == "ipo":
            counts = learned_counts(batch.target_rows, reference.shape[0])
            policy, reference = policy / counts, reference / counts
        return preference_loss(policy, reference, self.settings)

    def reference_logps(self, batch: Any) -> torch.Tensor:
        """Each row's summed log-probability under the base model (frozen copy or adapter disabled), no gradients."""
        with torch.no_grad():
            if self.reference is not None:
                return self.logps(batch, self.reference)
            with unwrapped(self.model).disable_adapter():
                return self.logps(batch)

    def logps(self, batch: Any, model: Any = None) -> torch.Tensor:
        """Each row's summed log-probability under `model`, by default the one training (the policy, or its base)."""
        n_rows = int(batch.inputs["input_ids"].shape[0])
        logits = (model or self.model)(**batch.inputs).logits
        return sequence_logps(logits, batch.targets, batch.target_rows, n_rows)
