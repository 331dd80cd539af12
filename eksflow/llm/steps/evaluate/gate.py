"""Evaluate's gate, pure: what its thresholds may name, the champion/challenger rule, the metrics they read.

The rules themselves are judged by eksflow.llm.steps.common.gate, the same code as the canary's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from pydantic import BaseModel

from eksflow.llm.steps.common.gate import Threshold, gate
from eksflow.llm.steps.evaluate.metrics import configured, shown
from eksflow.llm.steps.evaluate.preference import GAIN_RANGES, PREFERENCE_METRICS, PREFERENCE_RANGES

LOSS_METRICS = ("eval_loss", "perplexity")  # lower is better


def distinct_prefixes(first: str, second: str, length: int = 12) -> tuple[str, str]:
    """Two digests shortened for a message (`sha256:` dropped), each long enough that they read differently."""
    first, second = first.removeprefix("sha256:"), second.removeprefix("sha256:")
    while first[:length] == second[:length] and length < max(len(first), len(second)):
        length += 4
    return first[:length], second[:length]


class Champion(BaseModel):
    """What the registry recorded for the current champion version."""

    version: str
    eval_set_digest: str
    scores: dict[str, float]


class ChampionCheck(BaseModel):
    """The champion/challenger comparison: whether it applied, its inputs and its outcome."""

    applied: bool
    passed: bool
    reason: str
    version: str = ""
    metric: str = ""
    champion_score: float | None = None
    required: float | None = None
    actual: float | None = None


def threshold_metric(name: str, task_metrics: Sequence[str]) -> str:
    """The key of the evaluation's metrics (`combine`) that a threshold naming `name` reads.

    `name` is a tuned metric (eval_loss, perplexity or a task metric), `base_<metric>` (the base model's score on
    the same examples) or `<task metric>_gain` (tuned - base), a custom task metric by its full or its short name
    (eksflow.llm.steps.evaluate.metrics.configured: matched among `task_metrics`, nothing imported). ValueError naming
    the metrics known, or every metric the name could mean.
    """
    tuned = [*LOSS_METRICS, *task_metrics, *PREFERENCE_METRICS]
    forms = (("", "", tuned), ("base_", "", tuned), ("", "_gain", [*task_metrics, *PREFERENCE_METRICS]))
    if name in (f"{prefix}{metric}{suffix}" for prefix, suffix, pool in forms for metric in pool):
        return name
    found = set()
    for prefix, suffix, pool in forms:
        inner = name.removeprefix(prefix).removesuffix(suffix)
        if inner and f"{prefix}{inner}{suffix}" == name:
            try:
                metric = configured(inner, pool)
            except ValueError as err:
                raise ValueError(f"threshold on {name!r}: {err}") from err
            if metric is not None:
                found.add(f"{prefix}{metric}{suffix}")
    if len(found) > 1:
        either = " or ".join(sorted(found))
        raise ValueError(f"threshold on {name!r} could read {either}; name the one you mean in full")
    if not found:
        raise ValueError(f"threshold on unknown metric {name!r}; known metrics: {known_metrics(task_metrics)}")
    return found.pop()


def known_metrics(task_metrics: Sequence[str]) -> str:
    """What a threshold may name, for a message: the tuned metrics, then the base and gain forms in words."""
    return (
        f"{', '.join([*LOSS_METRICS, *shown(task_metrics)])}; each as base_<metric> for the base model's score, "
        f"and a task metric as <metric>_gain for tuned - base; under train.method=dpo also "
        f"{' and '.join(PREFERENCE_METRICS)}, with their base_ and _gain forms"
    )


# What each metric can measure: a task metric is a mean of per-row scores in [0, 1] (metrics.score refuses any
# other), its gain the difference of two such means, eval_loss a mean cross-entropy and perplexity its exponential.
TASK_METRIC_RANGE = (0.0, 1.0)
GAIN_RANGE = (-1.0, 1.0)
LOSS_RANGES = {"eval_loss": (0.0, math.inf), "perplexity": (1.0, math.inf)}


def metric_range(metric: str, task_metrics: Sequence[str]) -> tuple[float, float]:
    """The lowest and highest value metric key `metric` (as `threshold_metric` returns it) can take."""
    tuned = metric.removeprefix("base_") if metric not in task_metrics else metric
    if tuned in LOSS_RANGES:
        return LOSS_RANGES[tuned]
    if tuned in PREFERENCE_RANGES:
        return PREFERENCE_RANGES[tuned]
    if metric.removesuffix("_gain") in GAIN_RANGES:
        return GAIN_RANGES[metric.removesuffix("_gain")]
    if tuned not in task_metrics and metric.removesuffix("_gain") in task_metrics:
        return GAIN_RANGE
    return TASK_METRIC_RANGE


def never_holds(rule: Threshold, metric: str, task_metrics: Sequence[str]) -> str:
    """Why no model can meet `rule` on metric key `metric` (`exact_match >= 1.5`: at most 1), or "" when one can."""
    low, high = metric_range(metric, task_metrics)
    possible = {">=": rule.value <= high, ">": rule.value < high, "<=": rule.value >= low, "<": rule.value > low}
    if possible[rule.op]:
        return ""
    span = f"from {low:g} to {high:g}" if math.isfinite(high) else f"at least {low:g}"
    return f"threshold {rule.describe()} can never hold: {rule.metric} is {span}; give a value in that range"


def champion_gate(
    metrics: Mapping[str, float], champion: Champion | None, eval_set_digest: str, metric: str, margin: float
) -> ChampionCheck:
    """Compare with the champion when it was scored on the same eval set; see the module docstring for the rule."""
    if champion is None:
        return ChampionCheck(applied=False, passed=True, reason="no champion yet: thresholds only")
    if champion.eval_set_digest != eval_set_digest:
        theirs, ours = distinct_prefixes(champion.eval_set_digest, eval_set_digest)
        return ChampionCheck(
            applied=False,
            passed=True,
            version=champion.version,
            reason=(
                f"champion v{champion.version} was scored on eval set {theirs or '(unknown)'}, "
                f"this run on {ours}: not comparable, thresholds only"
            ),
        )
    recorded = champion.scores.get(metric)
    if recorded is None or math.isnan(recorded):
        return ChampionCheck(
            applied=False,
            passed=True,
            version=champion.version,
            reason=f"champion v{champion.version} has no recorded {metric}: not comparable, thresholds only",
        )
    lower_is_better = metric in LOSS_METRICS
    # Metrics are rounded to 6 digits (combine); so is the bar, or 0.7 + 0.05 would demand 0.7500000000000001.
    required = round(recorded - margin if lower_is_better else recorded + margin, 6)
    # A tie is not a win: with no margin the challenger must do strictly better; with one, beating the champion
    # by exactly the margin is strictly better already.
    op = ("<=" if lower_is_better else ">=") if margin else ("<" if lower_is_better else ">")
    rule = Threshold(metric=metric, op=op, value=required)
    verdict = gate(metrics, [rule])
    ok = verdict.passed
    actual = metrics.get(metric)
    return ChampionCheck(
        applied=True,
        passed=ok,
        version=champion.version,
        metric=metric,
        champion_score=recorded,
        required=required,
        actual=actual,
        reason=(
            f"{'beats' if ok else 'does not beat'} champion v{champion.version} ({metric} {recorded:.4f}, "
            f"margin {margin:g}): " + (rule.describe() if ok else verdict.reason)
        ),
    )


def combine(tuned: Mapping[str, float], base: Mapping[str, float], task_metrics: Sequence[str]) -> dict[str, float]:
    """Tuned metrics, base metrics prefixed `base_`, and `<metric>_gain` of the task and preference metrics."""
    metrics = dict(tuned)
    metrics.update({f"base_{k}": v for k, v in base.items()})
    gained = [*task_metrics, *(m for m in PREFERENCE_METRICS if m in tuned)]
    metrics.update({f"{m}_gain": tuned[m] - base[m] for m in gained})
    return {k: round(v, 6) for k, v in metrics.items()}
