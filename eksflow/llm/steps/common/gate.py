"""The gate, pure: rules `metric op value` judged against measured metrics, one result per rule.

Shared by `evaluate` (its thresholds) and the canary analysis (its rules at every step). A missing or NaN metric
fails its rule (fail closed), and no rule at all fails the gate: nothing ungated passes. Each rule is judged here
once; the reports print these results, never judge a rule again.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from pydantic import Field

from eksflow.runtime.args import Settings

COMPARISONS: dict[str, Callable[[float, float], bool]] = {
    ">=": operator.ge,
    ">": operator.gt,
    "<=": operator.le,
    "<": operator.lt,
}


class Threshold(Settings):
    """One gate rule: `metric op value`, e.g. exact_match >= 0.6."""

    metric: str
    op: Literal[">=", ">", "<=", "<"] = ">="
    value: float = Field(allow_inf_nan=False)

    def describe(self, label: str = "") -> str:
        """`exact_match >= 0.6`; `label` shown in place of the metric's name (the canary's `served_gap (sql_exact)`)."""
        return f"{label or self.metric} {self.op} {self.value:g}"


@dataclass(frozen=True)
class RuleResult:
    """One rule judged: the rule, the metric's value (NaN when missing) and whether it holds."""

    rule: Threshold
    value: float
    ok: bool

    def failure(self, label: str = "") -> str:
        """Why the rule failed, in one clause: `error_rate = 0.5000 fails error_rate <= 0` (`label`: as in describe)."""
        shown = label or self.rule.metric
        if math.isnan(self.value):
            return f"{shown} is missing or NaN (needs {self.rule.describe(label)})"
        return f"{shown} = {self.value:.4f} fails {self.rule.describe(label)}"

    def table_row(self, label: str = "") -> str:
        """A row of the `| rule | actual | result |` markdown table: `| exact_match >= 0.6 | 0.7500 | pass |`."""
        return f"| {self.rule.describe(label)} | {self.value:.4f} | {'pass' if self.ok else 'FAIL'} |"

    def report(self) -> dict[str, object]:
        """The rule and its result as a report's JSON: metric, op, value, actual (None when missing) and ok."""
        return {**self.rule.model_dump(), "actual": None if math.isnan(self.value) else self.value, "ok": self.ok}


@dataclass(frozen=True)
class Verdict:
    """The gate's decision: passed, one line saying why, and every rule's result in the order given."""

    passed: bool
    reason: str
    results: tuple[RuleResult, ...] = ()


def judge(metrics: Mapping[str, float], rule: Threshold) -> RuleResult:
    """One rule against the metrics; a missing or NaN metric fails it."""
    value = metrics.get(rule.metric)
    if value is None or math.isnan(value):
        return RuleResult(rule=rule, value=math.nan, ok=False)
    return RuleResult(rule=rule, value=value, ok=COMPARISONS[rule.op](value, rule.value))


def gate(
    metrics: Mapping[str, float], thresholds: Sequence[Threshold], labels: Mapping[str, str] | None = None
) -> Verdict:
    """Apply every threshold; missing and NaN metrics fail closed, and no threshold at all fails.

    `labels`: how the reason shows a metric, by name (the canary names the task metric its scores are in).
    """
    shown = labels or {}
    results = tuple(judge(metrics, rule) for rule in thresholds)
    if not results:
        return Verdict(False, "no thresholds configured: refusing to pass an ungated model")
    if failures := [r.failure(shown.get(r.rule.metric, "")) for r in results if not r.ok]:
        return Verdict(False, "; ".join(failures), results)
    met = ", ".join(r.describe(shown.get(r.metric, "")) for r in thresholds)
    return Verdict(True, "all thresholds met: " + met, results)
