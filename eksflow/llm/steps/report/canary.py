"""The canary section: every analysis step of the rollout as one picture, a verdict and a table. Pure: data in, text.

A rollout is judged step by step (eksflow/llm/steps/canary.py: analyze-0 before any traffic, then one analysis per
weight), so the page lays the steps out as columns and the quantities a reader compares across them as rows: the
candidate's observed share of live traffic beside the weight it was given, its served score beside what `evaluate`
measured and the champion's, the error rates, the p95 latency. A failed step's column is outlined and named in the
verdict with its failing rules; steps that never ran are greyed out, never drawn as zeros. A value the analysis could
not measure (NaN in the report, e.g. the share at 0 %) reads `n/a` in the picture and a dash in the table: a missing
bar is not a zero bar.

Each step's report is the JSON eksflow.llm.steps.canary.write_report leaves in --report-dir (canary-<percent>.json,
written on failure too); step.py reads it. Reports are untrusted input: every field is checked before use and every text
goes through `esc`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from eksflow.llm.steps.evaluate.gate import COMPARISONS
from eksflow.llm.steps.report.collect import MAIN, Task
from eksflow.llm.steps.report.svg import FONT, clip, esc, nice_ticks, phase_colours

PASSED, FAILED, NOT_RUN, RUNNING = "passed", "failed", "not run", "running"
OP_TEXT = {">=": "\u2265", ">": ">", "<=": "\u2264", "<": "<"}
WEIGHT, CANDIDATE, EVALUATED, CHAMPION = "#bdbdbd", "#1565c0", "#90caf9", "#ef6c00"
STATE_COLOURS = {PASSED: "Succeeded", FAILED: "Failed", NOT_RUN: "Skipped", RUNNING: "Running"}  # -> phase colours
LABEL_W, COL_W, HEAD_H, ROW_H, PAD = 150, 160, 66, 110, 12
BAR_W, BAR_GAP = 26, 8
NOTE_CHARS = 600


def report_file(percent: float) -> str:
    """The report canary.write_report names after its --percent (not imported: that loads the serving side)."""
    return f"canary-{percent:g}.json"


def percent_of(task: Task) -> float | None:
    """The step's weight, percent: its --percent argument, else its name's label (analyze-2-5 -> 2.5)."""
    for text in (task.arg("percent"), task.name.removeprefix("analyze-").replace("-", ".")):
        value = _number(text)
        if value is not None and 0 <= value <= 100:
            return value
    return None


def _number(value: object) -> float | None:
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


def _mapping(value: object) -> Mapping[str, Any]:
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
            found = _number(self.report.get("percent"))
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

    def metric(self, name: str) -> float | None:
        """A metric of the report; None when not measured (NaN) or there is no report."""
        return _number(_mapping((self.report or {}).get("metrics")).get(name))

    def failing_rules(self) -> list[tuple[str, str, float | None]]:
        """(metric, rule as written, actual value) of every rule the report's values do not meet (NaN fails)."""
        found = []
        for rule in (self.report or {}).get("rules") or []:
            if not isinstance(rule, Mapping):
                continue
            op, value, actual = str(rule.get("op", "")), _number(rule.get("value")), _number(rule.get("actual"))
            if actual is None or value is None or op not in COMPARISONS or not COMPARISONS[op](actual, value):
                metric = str(rule.get("metric"))
                found.append((metric, f"{metric} {op} {'?' if value is None else f'{value:g}'}", actual))
        return found

    def note(self) -> str:
        """What a reader needs besides the numbers: why it failed, why it did not run, why it has no report."""
        if self.state == NOT_RUN:
            return self.task.message or f"{self.task.name} is {self.task.phase}"
        if self.report is None:
            return "; ".join(t for t in ("no report", self.task.message, self.problem) if t)
        if self.state == FAILED:
            return str(self.report.get("reason", "")) if self.report.get("passed") is not True else self.task.message
        return ""


def section(steps: Sequence[CanaryStep], tasks: Sequence[Task]) -> str:
    """The Canary section: verdict, picture, table, traffic and probes; empty when the run has no canary."""
    if not steps:
        return ""
    ordered = sorted(steps, key=lambda s: (s.percent is None, s.percent or 0.0))
    promote = next((t for t in tasks if t.dag == MAIN and t.step.rsplit(".", 1)[-1] == "promote"), None)
    return (
        "<section><h2>Canary</h2>"
        + verdict(ordered, promote)
        + picture(ordered)
        + table(ordered)
        + _evidence(ordered)
        + "</section>"
    )


def verdict(steps: Sequence[CanaryStep], promote: Task | None) -> str:
    """Where the rollout stopped and why (the first failed step: its failing rules and reason), or that it passed."""
    failed = next((s for s in steps if s.state == FAILED), None)
    if failed is not None:
        rules = "; ".join(
            f"{rule} ({'not measured' if actual is None else f'actual {_plain(actual)}'})"
            for _, rule, actual in failed.failing_rules()
        )
        later = [s.task.name for s in steps[steps.index(failed) + 1 :] if s.state == NOT_RUN]
        return (
            f"<div class='decision fail'>stopped at {esc(failed.task.name)} ({esc(failed.label)})"
            + (f": failing {esc(rules)}" if rules else "")
            + "</div>"
            + f"<p><b>reason:</b> {esc(clip(failed.note(), NOTE_CHARS))}</p>"
            + (f"<p class='muted'>not run: {esc(', '.join(later))}</p>" if later else "")
        )
    if all(s.state == PASSED for s in steps):
        if promote is not None and promote.phase != "Succeeded":
            why = f": {promote.message}" if promote.message else ""
            return (
                f"<div class='decision fail'>every canary step passed, but {esc(promote.name)} is "
                f"{esc(promote.phase)}{esc(why)}</div>"
            )
        versions = [str(_mapping(s.report.get("candidate")).get("version", "")) for s in steps if s.report]
        who = f"candidate v{versions[-1]}" if versions and versions[-1] else "the candidate"
        return f"<div class='decision pass'>promoted: {esc(who)} passed every canary step</div>"
    idle = [s for s in steps if s.state != PASSED]
    if len(idle) == len(steps):
        return f"<p class='note'>the canary did not run: {esc(idle[0].note())}</p>"
    return f"<p class='note'>no canary step failed; not finished: {esc(', '.join(s.task.name for s in idle))}</p>"


# -- the picture ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One quantity across the steps: its series (label, colour, value of a step), axis top, rule limit, format."""

    title: str
    series: tuple[tuple[str, str, Callable[[CanaryStep], float | None]], ...]
    top: float
    shown: Callable[[float], str]
    limit: tuple[str, str, float] | None = None  # (metric, op, value) of the rule drawn across the row


def _pct(value: float) -> str:
    return f"{value * 100:.3g}%"


def _secs(value: float) -> str:
    return f"{value:.3g}s"


def _score(value: float) -> str:
    return f"{value:.3f}"


def _top(values: Iterable[float | None], floor: float) -> float:
    """A round axis top over the finite values, at least `floor`."""
    finite = [v for v in values if v is not None and math.isfinite(v)]
    return max(floor, nice_ticks(0.0, max(finite))[-1]) if finite and max(finite) > floor else floor


def _limit(steps: Sequence[CanaryStep], metric: str) -> tuple[str, str, float] | None:
    """The first rule a report applies to `metric`, as (metric, op, value)."""
    for step in steps:
        for rule in (step.report or {}).get("rules") or []:
            if isinstance(rule, Mapping) and rule.get("metric") == metric and rule.get("op") in COMPARISONS:
                value = _number(rule.get("value"))
                if value is not None and math.isfinite(value):
                    return metric, str(rule["op"]), value
    return None


def rows(steps: Sequence[CanaryStep]) -> list[Row]:
    """The picture's rows: traffic share vs weight, scores, error rates, p95 latency."""

    def of(name: str) -> Callable[[CanaryStep], float | None]:
        return lambda step: step.metric(name)

    def weight(step: CanaryStep) -> float | None:
        return None if step.percent is None else step.percent / 100

    errors = [s.metric(m) for s in steps for m in ("error_rate", "champion_error_rate")]
    error_limit = _limit(steps, "error_rate")
    latency_limit = _limit(steps, "p95_latency_s")
    scores = [s.metric(m) for s in steps for m in ("served_score", "evaluated_score", "champion_score")]
    return [
        Row(
            "traffic share",
            (("weight", WEIGHT, weight), ("observed share", CANDIDATE, of("candidate_share"))),
            1.0,
            _pct,
        ),
        Row(
            "score",
            (
                ("served", CANDIDATE, of("served_score")),
                ("evaluated", EVALUATED, of("evaluated_score")),
                ("champion", CHAMPION, of("champion_score")),
            ),
            _top(scores, 1.0),
            _score,
        ),
        Row(
            "error rate",
            (("candidate", CANDIDATE, of("error_rate")), ("champion", CHAMPION, of("champion_error_rate"))),
            _top([*errors, error_limit[2] if error_limit else None], 0.1),
            _pct,
            error_limit,
        ),
        Row(
            "p95 latency",
            (("candidate", CANDIDATE, of("p95_latency_s")),),
            _top([s.metric("p95_latency_s") for s in steps], 1.0),
            _secs,
            latency_limit,
        ),
    ]


def picture(steps: Sequence[CanaryStep]) -> str:
    """One SVG: a column per step (header: weight, task, outcome), a row per quantity with bars per series."""
    drawn = rows(steps)
    width = LABEL_W + COL_W * len(steps) + PAD
    height = HEAD_H + ROW_H * len(drawn) + PAD
    parts = [
        f"<svg class='canary' viewBox='0 0 {width} {height}' style='width:100%;max-width:{width}px;height:auto' "
        f"role='img' aria-label='canary steps' xmlns='http://www.w3.org/2000/svg' {FONT}>"
    ]
    for n, row in enumerate(drawn):
        parts.append(_row_frame(row, HEAD_H + n * ROW_H, width))
    for i, step in enumerate(steps):
        x = LABEL_W + i * COL_W
        parts.append(_column_head(step, x))
        if step.report is None:
            parts.append(_blank_column(step, x, len(drawn)))
        else:
            parts += [_bars(step, row, x, HEAD_H + n * ROW_H) for n, row in enumerate(drawn)]
        if step.state == FAILED:
            parts.append(
                f"<rect class='stopped' x='{x + 3}' y='2' width='{COL_W - 6}' height='{height - 4}' rx='8' "
                "fill='none' stroke='#c62828' stroke-width='2.5'/>"
            )
    return "".join(parts) + "</svg>"


def _row_frame(row: Row, y: float, width: float) -> str:
    """The row's title, legend and rule at the left; its axis top, baseline and rule line across the columns."""
    base, top_y = y + ROW_H - 14, y + 22
    parts = [
        f"<text x='10' y='{y + 18}' font-size='12.5' font-weight='600' fill='#222'>{esc(row.title)}</text>",
        f"<line x1='{LABEL_W}' x2='{width - PAD}' y1='{top_y}' y2='{top_y}' stroke='#eee'/>",
        f"<line x1='{LABEL_W}' x2='{width - PAD}' y1='{base}' y2='{base}' stroke='#888'/>",
        f"<text x='{LABEL_W - 4}' y='{top_y + 4}' font-size='10' fill='#666' text-anchor='end'>"
        f"{esc(row.shown(row.top))}</text>",
        f"<text x='{LABEL_W - 4}' y='{base + 4}' font-size='10' fill='#666' text-anchor='end'>0</text>",
    ]
    line = 34
    if row.limit is not None:
        metric, op, value = row.limit
        parts.append(
            f"<text x='10' y='{y + line}' font-size='10.5' fill='#c62828'>{esc(metric)} {esc(OP_TEXT[op])} "
            f"{esc(row.shown(value))}</text>"
        )
        line += 14
    for label, colour, _ in row.series:
        parts.append(
            f"<rect x='10' y='{y + line - 8}' width='10' height='10' fill='{colour}'/>"
            f"<text x='24' y='{y + line}' font-size='10.5' fill='#444'>{esc(label)}</text>"
        )
        line += 14
    return "".join(parts)


def _column_head(step: CanaryStep, x: float) -> str:
    """The step's weight, task name and outcome (a pill whose tooltip says why)."""
    stroke, fill = phase_colours(STATE_COLOURS[step.state])
    centre = x + COL_W / 2
    outcome = step.state.upper() if step.state == FAILED else step.state
    if step.report is None and step.state != NOT_RUN:
        outcome += " \u00b7 no report"
    dash = " stroke-dasharray='4 3'" if step.state == NOT_RUN else ""
    note = step.note()
    tooltip = f"{step.task.name}: {outcome}" + (f"\n{note}" if note else "")
    return (
        f"<g class='step' data-state='{esc(step.state)}'><title>{esc(tooltip)}</title>"
        f"<text x='{centre:.0f}' y='18' font-size='13' font-weight='600' fill='#222' text-anchor='middle'>"
        f"{esc(step.label)}</text>"
        f"<text x='{centre:.0f}' y='33' font-size='10.5' fill='#666' text-anchor='middle'>"
        f"{esc(clip(step.task.name, 24))}</text>"
        f"<rect x='{x + 12}' y='40' width='{COL_W - 24}' height='19' rx='9' fill='{fill}' stroke='{stroke}'{dash}/>"
        f"<text x='{centre:.0f}' y='54' font-size='11' font-weight='600' fill='{stroke}' text-anchor='middle'>"
        f"{esc(outcome)}</text></g>"
    )


def _blank_column(step: CanaryStep, x: float, row_count: int) -> str:
    """A step without numbers: not run, or ran and left no report. Grey, so that nothing reads as a zero."""
    top, height = HEAD_H + 4, row_count * ROW_H - 8
    text = NOT_RUN if step.state == NOT_RUN else "no report"
    return (
        f"<rect class='blank' x='{x + 8}' y='{top}' width='{COL_W - 16}' height='{height}' rx='6' fill='#f4f4f4' "
        f"stroke='#bdbdbd' stroke-dasharray='5 4'/>"
        f"<text x='{x + COL_W / 2:.0f}' y='{top + height / 2:.0f}' font-size='12' fill='#777' text-anchor='middle' "
        f"font-style='italic'>{esc(text)}</text>"
    )


def _bars(step: CanaryStep, row: Row, x: float, y: float) -> str:
    """The row's series for one step as bars from a shared baseline; n/a where the report has no value."""
    base, plot_h = y + ROW_H - 14, ROW_H - 36
    group = len(row.series) * BAR_W + (len(row.series) - 1) * BAR_GAP
    left = x + (COL_W - group) / 2
    parts = []
    for n, (label, colour, value_of) in enumerate(row.series):
        value = value_of(step)
        bx, centre = left + n * (BAR_W + BAR_GAP), left + n * (BAR_W + BAR_GAP) + BAR_W / 2
        if value is None or not math.isfinite(value):
            parts.append(
                f"<text class='missing' x='{centre:.1f}' y='{base - 4}' font-size='10' fill='#999' "
                f"font-style='italic' text-anchor='middle'><title>{esc(step.task.name)} {esc(label)}: "
                f"not measured</title>n/a</text>"
            )
            continue
        h = max(1.0, min(max(value, 0.0) / row.top, 1.0) * plot_h)
        parts.append(
            f"<rect class='bar' x='{bx:.1f}' y='{base - h:.1f}' width='{BAR_W}' height='{h:.1f}' fill='{colour}'>"
            f"<title>{esc(step.task.name)} {esc(label)}: {esc(row.shown(value))}</title></rect>"
            f"<text x='{centre:.1f}' y='{base - h - 3:.1f}' font-size='10' fill='#444' text-anchor='middle'>"
            f"{esc(row.shown(value))}</text>"
        )
    if row.limit is not None and 0 < row.limit[2] <= row.top:
        metric, op, limit = row.limit
        ly = base - limit / row.top * plot_h
        parts.append(
            f"<line x1='{left - 6:.1f}' x2='{left + group + 6:.1f}' y1='{ly:.1f}' y2='{ly:.1f}' stroke='#c62828' "
            f"stroke-width='1.5' stroke-dasharray='4 3'><title>rule: {esc(metric)} {esc(op)} {limit:g}</title></line>"
        )
    return "".join(parts)


# -- the numbers ----------------------------------------------------------------------------------------------------


def _plain(value: float | None, shown: Callable[[float], str] = lambda v: f"{v:.4g}") -> str:
    """A value as text: infinities as signs, a dash when not measured."""
    if value is None:
        return "\u2013"
    if math.isinf(value):
        return "\u221e" if value > 0 else "-\u221e"
    return shown(value)


TABLE_METRICS: tuple[tuple[str, Callable[[float], str]], ...] = (
    ("candidate_share", lambda v: f"{v * 100:.1f} %"),
    ("share_z", lambda v: f"{v:.2f}"),
    ("served_score", lambda v: f"{v:.4f}"),
    ("evaluated_score", lambda v: f"{v:.4f}"),
    ("served_gap", lambda v: f"{v:.4f}"),
    ("champion_score", lambda v: f"{v:.4f}"),
    ("score_vs_champion", lambda v: f"{v:+.4f}"),
    ("error_rate", lambda v: f"{v * 100:.1f} %"),
    ("champion_error_rate", lambda v: f"{v * 100:.1f} %"),
    ("p95_latency_s", lambda v: f"{v:.3f} s"),
)


def table(steps: Sequence[CanaryStep]) -> str:
    """The picture's numbers, a column per step: outcome, weight, live requests, every metric, the note.

    A dash is a value the step did not measure; an empty cell is a step with no report; a red value failed a rule.
    """
    head = "".join(f"<th>{esc(s.label)}<br><span class='muted mono'>{esc(s.task.name)}</span></th>" for s in steps)
    body = ["<tr><td>outcome</td>" + "".join(_outcome_cell(s) for s in steps) + "</tr>"]
    weights = "".join(f"<td class='num'>{'' if s.percent is None else esc(f'{s.percent:g} %')}</td>" for s in steps)
    body.append(f"<tr><td>weight</td>{weights}</tr>")
    requests = "".join(
        f"<td class='num'>{esc(_mapping(s.report.get('live_traffic')).get('requests', ''))}</td>"
        if s.report
        else "<td></td>"
        for s in steps
    )
    body.append(f"<tr><td>live requests</td>{requests}</tr>")
    failing = [{metric for metric, _, _ in s.failing_rules()} for s in steps]
    for name, shown in TABLE_METRICS:
        cells = []
        for step, bad in zip(steps, failing, strict=True):
            value = step.metric(name)
            if step.report is None:
                cells.append("<td></td>")
            elif value is None:
                cells.append("<td class='num muted' title='not measured'>\u2013</td>")
            else:
                cells.append(f"<td class='num{' bad' if name in bad else ''}'>{esc(_plain(value, shown))}</td>")
        body.append(f"<tr><td class='mono'>{esc(name)}</td>{''.join(cells)}</tr>")
    notes = "".join(f"<td class='text'>{esc(clip(s.note(), NOTE_CHARS))}</td>" for s in steps)
    body.append(f"<tr><td>note</td>{notes}</tr>")
    # Fixed layout: a long note wraps within its step's column instead of widening it.
    return (
        "<table class='canary' style='table-layout:fixed'><colgroup><col style='width:11em'></colgroup>"
        f"<tr><th></th>{head}</tr>{''.join(body)}</table>"
    )


def _outcome_cell(step: CanaryStep) -> str:
    css = {PASSED: "good", FAILED: "bad"}.get(step.state, "muted")
    text = step.state.upper() if step.state == FAILED else step.state
    if step.state == NOT_RUN:
        text += f" ({step.task.phase})"
    elif step.report is None:
        text += ", no report"
    return f"<td class='{css}'>{esc(text)}</td>"


def _evidence(steps: Sequence[CanaryStep]) -> str:
    """What each analysis sent: its live requests and why that many, which slot served them, how probes came."""
    items = []
    for step in steps:
        if step.report is None:
            continue
        live = _mapping(step.report.get("live_traffic"))
        served = ", ".join(f"{k} {v}" for k, v in sorted(_mapping(live.get("served_by")).items(), key=str))
        asked = []
        for role, raw in _mapping(step.report.get("probes_asked")).items():
            how = _mapping(raw)
            if how.get("reused_from"):
                asked.append(f"{role} reused from {how['reused_from']}")
            else:
                asked.append(f"{role} {how.get('sent', '?')} sent ({how.get('errors', '?')} failed)")
        lines = [
            str(live.get("sized", "")),
            f"served by: {served}" if served else "",
            f"probes: {', '.join(asked)}" if asked else "",
        ]
        items.append(f"<li><b>{esc(step.task.name)}</b>: {esc('; '.join(t for t in lines if t))}</li>")
    if not items:
        return ""
    return f"<details><summary>live traffic and probes per step</summary><ul>{''.join(items)}</ul></details>"
