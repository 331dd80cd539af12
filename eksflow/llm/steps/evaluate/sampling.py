"""Scoring a sample of a large held-out set: which examples (seeded), and how far the sampled score may be off.

`sample_size` N < n scores N examples drawn without replacement by `sample_seed` (numpy's seeded generator) and
kept in file order; the same file, N and seed always give the same sample. The eval_set_digest then ends in
`@sample-<N>-seed-<seed>`, so a sampled score is only ever compared with a score on the same sample.

A task metric scores each example 0 or 1, so its sampled mean is a binomial proportion: its confidence interval
is Wilson's score interval (good coverage near 0 and 1 and at small N, where the normal approximation is not).
With N a large share of n the interval is conservative (it ignores the finite-population correction).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from statistics import NormalDist
from typing import TypeVar

from eksflow.llm.steps.common.data import Example, usable_examples
from eksflow.llm.steps.evaluate import metrics as task_metric_functions
from eksflow.runtime.args import StepInputError


def sample_indices(n: int, size: int, seed: int) -> list[int]:
    """`size` of range(n) drawn without replacement by `seed`, in increasing order; all of them when size >= n."""
    import numpy as np

    if size >= n:
        return list(range(n))
    return sorted(int(i) for i in np.random.default_rng(seed & (2**64 - 1)).choice(n, size=size, replace=False))


Record = TypeVar("Record")


def load_sample(
    path: Path,
    size: int,
    seed: int,
    records: Callable[[Path], Iterator[tuple[int, Record]]] = usable_examples,  # type: ignore[assignment]
) -> tuple[list[Record], int]:
    """The sampled usable records of `path` and how many it holds (two streamed passes).

    `records` reads them: SFT's examples (data.usable_examples), or DPO's pairs (preference.usable_preferences).
    """
    total = sum(1 for _ in records(path))
    if total == 0:
        raise StepInputError(f"{str(path)!r} holds no usable records to sample from")
    wanted = iter(sample_indices(total, size, seed))
    examples: list[Record] = []
    target = next(wanted, None)
    for index, (_, example) in enumerate(records(path)):
        if index == target:
            examples.append(example)
            target = next(wanted, None)
    return examples, total


def sample_suffix(size: int, seed: int, total: int) -> str:
    """What the eval_set_digest gets when a sample is scored ("" when the sample is the whole set)."""
    return f"@sample-{size}-seed-{seed}" if 0 < size < total else ""


def wilson_interval(successes: int, n: int, confidence: float) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion successes/n at `confidence` (e.g. 0.95)."""
    if n <= 0 or not 0 <= successes <= n:
        raise ValueError(f"need 0 <= successes <= n and n > 0, got {successes}/{n}")
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    p = successes / n
    denominator = 1 + z * z / n
    center = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    return max(0.0, center - half), min(1.0, center + half)


def intervals(
    task_metrics: Sequence[str],
    answers: Mapping[str, Sequence[str]],
    examples: Sequence[Example],
    confidence: float,
) -> dict[str, list[float]]:
    """Intervals of each task metric of each model ("tuned": `<metric>`, "base": `base_<metric>`).

    Wilson's for a metric scoring rows 0 or 1 (exact match, contains, JSON match); for partial credit (ROUGE-L, a
    user's metric) the normal interval of the mean. Rows a metric cannot score (NaN) are left out, as in its mean.
    """
    found: dict[str, list[float]] = {}
    for model, prefix in (("tuned", ""), ("base", "base_")):
        for name in task_metrics:
            metric = task_metric_functions.resolve(name)
            scores = [metric(a, e.completion) for a, e in zip(answers[model], examples, strict=True)]
            values = [float(s) for s in scores if not math.isnan(s)]
            if not values:
                continue
            if all(v in (0.0, 1.0) for v in values):
                low, high = wilson_interval(round(sum(values)), len(values), confidence)
            else:
                low, high = mean_interval(values, confidence)
            found[f"{prefix}{name}"] = [round(low, 4), round(high, 4)]
    return found


def mean_interval(values: Sequence[float], confidence: float) -> tuple[float, float]:
    """Normal-approximation interval of a mean of scores in [0, 1], clipped to [0, 1]."""
    n = len(values)
    mean = sum(values) / n
    spread = math.sqrt(sum((v - mean) ** 2 for v in values) / max(n - 1, 1))
    half = NormalDist().inv_cdf(0.5 + confidence / 2) * spread / math.sqrt(n)
    return max(0.0, mean - half), min(1.0, mean + half)
