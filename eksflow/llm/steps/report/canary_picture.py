"""The canary picture: every analysis step a column, each quantity a reader compares across them a row. Pure.

Rows: the candidate's observed share of live traffic beside the weight it was given, its served score beside what
`evaluate` measured and the champion's, the error rates, the p95 latency, each with the rule's limit drawn across it.
A failed step's column is outlined; steps that never ran are greyed out, never drawn as zeros; a value the analysis
could not measure reads `n/a`. Every text goes through `esc`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from eksflow.llm.steps.report.canary_steps import FAILED, NOT_RUN, OP_TEXT, PASSED, RUNNING, CanaryStep, number
from eksflow.llm.steps.report.svg import FONT, clip, esc, nice_ticks, phase_colours

WEIGHT, CANDIDATE, EVALUATED, CHAMPION = "#bdbdbd", "#1565c0", "#90caf9", "#ef6c00"
STATE_COLOURS = {PASSED: "Succeeded", FAILED: "Failed", NOT_RUN: "Skipped", RUNNING: "Running"}  # -> phase colours
LABEL_W, COL_W, HEAD_H, ROW_H, PAD = 150, 160, 66, 110, 12
BAR_W, BAR_GAP = 26, 8
TITLE_CHARS = 20  # of a row's title, within LABEL_W at its font size


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
            if isinstance(rule, Mapping) and rule.get("metric") == metric and rule.get("op") in OP_TEXT:
                value = number(rule.get("value"))
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
    task_metric = next((s.task_metric for s in steps if s.task_metric), "")
    return [
        Row(
            "traffic share",
            (("weight", WEIGHT, weight), ("observed share", CANDIDATE, of("candidate_share"))),
            1.0,
            _pct,
        ),
        Row(
            clip(f"score ({task_metric})", TITLE_CHARS) if task_metric else "score",
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
