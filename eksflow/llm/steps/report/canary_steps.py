"""What a canary analysis step reported, checked: its weight, state, metrics, the rules it failed, and why.

Each step's report is the JSON eksflow.llm.steps.canary.report.write_report leaves in --report-dir
(canary-<percent>.json, written on failure too). Reports are untrusted input: every field is checked before use.
Each rule's result is taken as the analysis judged it (its `ok`), never judged again.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from eksflow.llm.steps.report.collect import Task

PASSED, FAILED, NOT_RUN, RUNNING = "passed", "failed", "not run", "running"
OP_TEXT = {">=": "\u2265", ">": ">", "<=": "\u2264", "<": "<"}


def report_file(percent: float) -> str:
    """The report the canary step names after its --percent (not imported: that loads the serving side)."""
    return f"canary-{percent:g}.json"


def percent_of(task: Task) -> float | None:
    """The step's weight, percent: its --percent argument, else its name's label (analyze-2-5 -> 2.5)."""
    for text in (task.arg("percent"), task.name.removeprefix("analyze-").replace("-", ".")):
        value = number(text)
        if value is not None and 0 <= value <= 100:
            return value
    return None


def number(value: object) -> float | None:
    """A report value as a float with infinities kept (share_z is infinite off a 0 or 100 % weight), else None.

    write_report stores non-finite metrics as the strings 'nan' and 'inf'; NaN, missing and anything that is not a
    number give None: not measured.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    try:
        number = float(value)
    except ValueError:
        return None
    return None if math.isnan(number) else number


def mapping(value: object) -> Mapping[str, Any]:
    """`value` if it is a mapping, else an empty one (a report's field of the wrong type reads as missing)."""
    return value if isinstance(value, Mapping) else {}


@dataclass(frozen=True)
class CanaryStep:
    """One analyze task and its report (canary-<percent>.json), or why there is none."""

    task: Task
    report: Mapping[str, Any] | None
    problem: str = ""  # why there is no report: unreadable file, or the task's own reason for writing none

    @property
    def percent(self) -> float | None:
        """The weight the step analysed, percent."""
        found = percent_of(self.task)
        if found is None and self.report is not None:
            found = number(self.report.get("percent"))
        return found

    @property
    def label(self) -> str:
        """`pre-traffic 0 %`, `10 %`; the task's name when its weight is unknown."""
        if self.percent is None:
            return self.task.name
        return f"pre-traffic {self.percent:g} %" if self.percent == 0 else f"{self.percent:g} %"

    @property
    def state(self) -> str:
        """PASSED, FAILED, NOT_RUN or RUNNING: the report decides, unless the task itself failed after writing it."""
        if self.task.phase in ("Failed", "Error"):
            return FAILED
        if self.report is not None:
            return PASSED if self.report.get("passed") is True else FAILED
        return {"Succeeded": PASSED, "Running": RUNNING}.get(self.task.phase, NOT_RUN)

    @property
    def task_metric(self) -> str:
        """The task metric the step's scores are in, as its report names it ("" when it names none)."""
        value = (self.report or {}).get("task_metric")
        return value if isinstance(value, str) else ""

    def shown(self, name: str) -> str:
        """A metric as the analysis named it: a score with its task metric, `served_score (sql_exact)`."""
        label = mapping((self.report or {}).get("shown")).get(name)
        return label if isinstance(label, str) and label else name

    def metric(self, name: str) -> float | None:
        """A metric of the report; None when not measured (NaN) or there is no report."""
        return number(mapping((self.report or {}).get("metrics")).get(name))

    def failing_rules(self) -> list[tuple[str, str, float | None]]:
        """(metric, rule as written, actual value) of every rule the analysis did not find `ok` (fails closed)."""
        found = []
        for rule in (self.report or {}).get("rules") or []:
            if not isinstance(rule, Mapping):
                continue
            op, value, actual = str(rule.get("op", "")), number(rule.get("value")), number(rule.get("actual"))
            if rule.get("ok") is not True:
                metric = str(rule.get("metric"))
                found.append((metric, f"{self.shown(metric)} {op} {'?' if value is None else f'{value:g}'}", actual))
        return found

    def note(self) -> str:
        """What a reader needs besides the numbers: why it failed, why it did not run, why it has no report."""
        if self.state == NOT_RUN:
            return self.task.message or f"{self.task.name} is {self.task.phase}"
        if self.report is None:
            return "; ".join(t for t in ("no report", self.task.message, self.problem) if t)
        if self.state == FAILED:
            return str(self.report.get("reason", "")) if self.report.get("passed") is not True else self.task.message
        return "; ".join(self.fleet_losses())

    def fleet_losses(self) -> list[str]:
        """What the fleet lost while the step measured, as its report names it (pod, node): none, mostly.

        Each measurement the step did not judge for a lost replica and measured again, and a loss during the judged one.
        """
        fleet = mapping((self.report or {}).get("fleet"))
        again, lost = fleet.get("discarded"), fleet.get("lost")
        found = (
            [f"not judged, measured again: {d}" for d in again if isinstance(d, str)] if isinstance(again, list) else []
        )
        if isinstance(lost, list) and (named := [x for x in lost if isinstance(x, str)]):
            found.append(f"lost during the judged measurement: {'; '.join(named)}")
        return found


def plain(value: float | None, shown: Callable[[float], str] = lambda v: f"{v:.4g}") -> str:
    """A value as text: infinities as signs, a dash when not measured."""
    if value is None:
        return "\u2013"
    if math.isinf(value):
        return "\u221e" if value > 0 else "-\u221e"
    return shown(value)
