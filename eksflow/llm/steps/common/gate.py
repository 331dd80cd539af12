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

    def describe(self) -> str:
        """`exact_match >= 0.6`."""
        return f"{self.metric} {self.op} {self.value:g}"


@dataclass(frozen=True)
class RuleResult:
    """One rule judged: the rule, the metric's value (NaN when missing) and whether it holds."""

    rule: Threshold
    value: float
    ok: bool

    def failure(self) -> str:
        """Why the rule failed, in one clause: `error_rate = 0.5000 fails error_rate <= 0`."""
        if math.isnan(self.value):
            return f"{self.rule.metric} is missing or NaN (needs {self.rule.describe()})"
        return f"{self.rule.metric} = {self.value:.4f} fails {self.rule.describe()}"

    def table_row(self) -> str:
        """A row of the `| rule | actual | result |` markdown table: `| exact_match >= 0.6 | 0.7500 | pass |`."""
        return f"| {self.rule.describe()} | {self.value:.4f} | {'pass' if self.ok else 'FAIL'} |"

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


def gate(metrics: Mapping[str, float], thresholds: Sequence[Threshold]) -> Verdict:
    """Apply every threshold; missing and NaN metrics fail closed, and no threshold at all fails."""
    results = tuple(judge(metrics, rule) for rule in thresholds)
    if not results:
        return Verdict(False, "no thresholds configured: refusing to pass an ungated model")
    if failures := [r.failure() for r in results if not r.ok]:
        return Verdict(False, "; ".join(failures), results)
    return Verdict(True, "all thresholds met: " + ", ".join(r.describe() for r in thresholds), results)
