"""Held-out preference pairs (method dpo): how often, and by how much, a model ranks chosen above rejected.

Each answer's log-probability is the sum over its learned tokens (the answer's own assistant turns, tokenized as
training tokenizes them: encoding.encode_batch, preference.answer_spans) of log p(token | what precedes it). With
the base model's (b) and the tuned model's (t) log-probabilities of the chosen (c) and rejected (x) answers:

    preference_accuracy       share of pairs whose implicit reward beta * (t - b) ranks chosen above rejected:
                              (tc - bc) > (tx - bx), as TRL's rewards/accuracies counts them
    reward_margin             mean of beta * ((tc - bc) - (tx - bx))
    base_preference_accuracy  share of pairs where the base model gives chosen the higher log-likelihood: bc > bx
                              (the base model's reward against itself is 0 for every answer)
    base_reward_margin        mean of beta * (bc - bx): the same scale, the base model's own margin

`<metric>_gain` is tuned - base, as for the task metrics (gate.combine). Generation metrics and eval_loss are
scored on the chosen answers (the reference a generated answer is compared with).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from eksflow.llm.steps.common.preference import Preference, answer_spans

PREFERENCE_METRICS = ("preference_accuracy", "reward_margin")  # higher is better
# What each can measure (gate.metric_range): an accuracy is a share, a margin any real number
PREFERENCE_RANGES = {"preference_accuracy": (0.0, 1.0), "reward_margin": (-float("inf"), float("inf"))}
GAIN_RANGES = {"preference_accuracy": (-1.0, 1.0), "reward_margin": (-float("inf"), float("inf"))}


def answer_logps(model: Any, tokenizer: Any, pairs: Sequence[Preference], batch_size: int) -> list[tuple[float, float]]:
    """(chosen, rejected) summed log-probabilities of each pair's answers under `model` (no gradients)."""
    import torch

    from eksflow.llm.steps.common.encoding import encode_batch
    from eksflow.llm.steps.common.modeling import IGNORE_INDEX, collate, truncated

    sums: dict[int, list[float]] = {0: [], 1: []}
    for which in (0, 1):
        for start in range(0, len(pairs), batch_size):
            part = pairs[start : start + batch_size]
            ids, spans = encode_batch(tokenizer, [p.answers()[which] for p in part])
            rows = [
                truncated(
                    row, answer_spans(learned, pair.chosen_turns if which == 0 else pair.rejected_turns), len(row)
                )
                for row, learned, pair in zip(ids, spans, part, strict=True)
            ]
            batch = {k: v.to(model.device) for k, v in collate(rows, 0).items()}
            with torch.inference_mode():
                logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
            labels = batch["labels"][:, 1:]
            learned_mask = labels != IGNORE_INDEX
            picked = torch.log_softmax(logits[:, :-1].float(), dim=-1).gather(-1, labels.clamp(min=0)[..., None])
            sums[which] += (picked.squeeze(-1) * learned_mask).sum(dim=1).tolist()
    return list(zip(sums[0], sums[1], strict=True))


def preference_metrics(
    tuned: Sequence[tuple[float, float]], base: Sequence[tuple[float, float]], beta: float
) -> tuple[dict[str, float], dict[str, float]]:
    """(tuned metrics, base metrics) of the pairs' log-probabilities, as the module docstring defines them."""
    n = max(len(tuned), 1)
    rewards = [
        (beta * (tc - bc), beta * (tx - bx)) for (tc, tx), (bc, bx) in zip(tuned, base, strict=True)
    ]  # the implicit rewards of chosen and rejected
    tuned_metrics = {
        "preference_accuracy": sum(1.0 for c, x in rewards if c > x) / n,
        "reward_margin": sum(c - x for c, x in rewards) / n,
    }
    base_metrics = {
        "preference_accuracy": sum(1.0 for bc, bx in base if bc > bx) / n,
        "reward_margin": sum(beta * (bc - bx) for bc, bx in base) / n,
    }
    return tuned_metrics, base_metrics
