"""The page: one HTML document with inline CSS and SVG, no scripts, no external assets. Pure: data in, text out.

A Content-Security-Policy meta tag forbids scripts and every remote load, so even a string that escaped
escaping could not run or fetch anything (the Argo UI sandboxes artifacts the same way). Every value from the
workflow, the reports or MLflow goes through `esc`; links are kept only when they are http(s) or relative.
"""

from __future__ import annotations

import json
import math
import re
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from eksflow.llm.steps.report import canary, svg
from eksflow.llm.steps.report.canary_steps import CanaryStep
from eksflow.llm.steps.report.collect import EXIT, MAIN, RunFacts, Task
from eksflow.llm.steps.report.runs import EndedRun, TrainingRun
from eksflow.llm.steps.report.style import CSP, CSS
from eksflow.llm.steps.report.svg import esc
from eksflow.runtime.readable import format_duration

LOWER_IS_BETTER = re.compile(r"loss|perplexity")
VALUE_CHARS = 240  # an output longer than this is folded into a <details>
SAMPLE_CHARS = 1200


@dataclass(frozen=True)
class Evaluation:
    """An evaluation task and its report (evaluate's eval_report.json), or why there is none."""

    task: Task
    report: Mapping[str, Any] | None
    problem: str = ""


@dataclass(frozen=True)
class Validation:
    """A validation task and its summary (validation.json), with a link to its Data Docs."""

    task: Task
    summary: Mapping[str, Any] | None
    docs_href: str = ""  # relative to the page, or empty when the Data Docs are not there
    docs_path: str = ""
    problem: str = ""


@dataclass(frozen=True)
class Page:
    """Everything the page shows."""

    facts: RunFacts
    now: datetime
    training_tasks: Sequence[Task] = ()
    training_runs: Sequence[TrainingRun] = ()
    evaluations: Sequence[Evaluation] = ()
    validations: Sequence[Validation] = ()
    registrations: Sequence[Task] = ()
    rollouts: Sequence[Task] = ()
    canary_steps: Sequence[CanaryStep] = ()
    ended_runs: Sequence[EndedRun] = ()
    notes: Sequence[str] = field(default_factory=tuple)  # what could not be read (MLflow down, files missing)


def safe_href(target: str) -> str:
    """`target` as an attribute value if it is an http(s) URL or a relative path; empty otherwise."""
    parsed = urllib.parse.urlparse(target)
    if parsed.scheme in ("http", "https") and parsed.netloc:
        return esc(target)
    if not parsed.scheme and not parsed.netloc and target and not target.startswith("/"):
        return esc(urllib.parse.quote(target, safe="/#?=&.-_~%"))
    return ""


def link(target: str, text: str) -> str:
    """An anchor when the target is safe, else the text alone."""
    href = safe_href(target)
    return f"<a href='{href}'>{esc(text)}</a>" if href else esc(text)


def badge(phase: str) -> str:
    """A coloured phase label."""
    return f"<span class='badge {_css(phase)}'>{esc(phase)}</span>"


def number(value: object, digits: int = 4) -> str:
    """A metric as text: fixed digits for floats, a dash for missing or non-finite values."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return "\u2013"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def render(page: Page) -> str:
    """The whole document."""
    facts = page.facts
    body = [
        _header(page),
        _dag_section(page),
        _training(page),
        *(_evaluation(e) for e in page.evaluations),
        *(_validation(v) for v in page.validations),
        _registry(page),
        canary.section(page.canary_steps, facts.tasks),
        _tasks(page),
        _mlflow(page),
    ]
    title = facts.title or facts.name
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        f"<meta http-equiv='Content-Security-Policy' content=\"{CSP}\">"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<title>{esc(title)} \u00b7 {esc(facts.name)}</title><style>{CSS}</style></head><body><main>"
        + "".join(b for b in body if b)
        + f"<footer>report of workflow {esc(facts.name)}, written {esc(page.now.strftime('%Y-%m-%d %H:%M:%S UTC'))}"
        "</footer></main></body></html>\n"
    )


def _css(phase: str) -> str:
    return re.sub(r"[^A-Za-z]", "", phase)


def _when(value: datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S UTC") if value else ""


def _header(page: Page) -> str:
    facts = page.facts
    took = ""
    if facts.started_at:
        took = format_duration(((facts.finished_at or page.now) - facts.started_at).total_seconds())
    rows = "".join(f"<tr><th>{esc(k)}</th><td class='mono'>{esc(v)}</td></tr>" for k, v in facts.parameters.items())
    return (
        f"<header class='{_css(facts.phase)}'><h1>{esc(facts.title or facts.name)}</h1>"
        f"<div>workflow <code>{esc(facts.name)}</code> {badge(facts.phase)}"
        + (f" <span class='muted'>started {esc(_when(facts.started_at))}, {esc(took)}</span>" if took else "")
        + "</div>"
        + (f"<div class='muted'>{esc(facts.description)}</div>" if facts.description else "")
        + (f"<div class='bad'>{esc(facts.message)}</div>" if facts.message else "")
        + (f"<details><summary>parameters</summary><table>{rows}</table></details>" if rows else "")
        + "</header>"
    )


def _box(task: Task, now: datetime) -> svg.Box:
    duration = format_duration(task.duration_s(now))
    running = task.phase == "Running"
    detail = task.phase + (f" \u00b7 {duration}" if duration else "") + (" so far" if running and duration else "")
    if task.items:
        detail += f" \u00b7 {task.items} items"
    tooltip = f"{task.name} ({task.step or task.template}): {task.phase}" + (
        f"\n{task.message}" if task.message else ""
    )
    return svg.Box(task.name, task.phase, detail, tooltip, task.needs)


def _dag_section(page: Page) -> str:
    facts = page.facts
    lanes = [
        ("main DAG", [_box(t, page.now) for t in facts.in_dag(MAIN)]),
        (
            "exit handler (runs whatever the outcome; still running while this page is written)",
            [_box(t, page.now) for t in facts.in_dag(EXIT)],
        ),
    ]
    if not facts.tasks:
        return "<section><h2>DAG</h2><p class='note'>the workflow spec has no DAG tasks</p></section>"
    legend = "".join(
        f"<span><i style='background:{fill};border:2px solid {stroke}'></i>{esc(phase)}</span>"
        for phase, (stroke, fill) in svg.PHASE_COLOURS.items()
        if phase != "Error"
    )
    missing = f"<p class='note'>{esc(facts.nodes_missing)}</p>" if facts.nodes_missing else ""
    return (
        f"<section><h2>DAG</h2><div class='scroll'>{svg.dag(lanes)}</div><div class='legend'>{legend}</div>"
        f"{missing}</section>"
    )


def _not_run(tasks: Sequence[Task]) -> str:
    lines = [
        f"<li><b>{esc(t.name)}</b> {badge(t.phase)}"
        + (f" <span class='muted'>{esc(t.message)}</span>" if t.message else "")
        + "</li>"
        for t in tasks
        if t.phase != "Succeeded"
    ]
    return f"<ul>{''.join(lines)}</ul>" if lines else ""


def _training(page: Page) -> str:
    if not page.training_tasks and not page.training_runs:
        return "<section><h2>Training</h2><p class='note'>this pipeline has no training task</p></section>"
    parts = ["<section><h2>Training</h2>", _not_run(page.training_tasks)]
    plotted = [r for r in page.training_runs if r.history]
    if plotted:
        several = len(plotted) > 1

        def series(key: str) -> list[svg.Series]:
            return [
                svg.Series(r.name if several and r.name else r.run_id[:8], r.history.get(key, ()))
                for r in plotted
                if key in r.history
            ]

        parts.append("<div class='charts'>")
        parts.append(svg.line_chart("training loss", series("loss")))
        parts.append(svg.line_chart("learning rate", series("learning_rate")))
        if any("tokens_per_s" in r.history for r in plotted):
            parts.append(svg.line_chart("throughput (tokens/s)", series("tokens_per_s")))
        parts.append("</div>")
    elif all(t.phase in ("Skipped", "Omitted") for t in page.training_tasks):
        parts.append("<p class='note'>training did not run in this workflow, so there are no curves</p>")
    else:
        parts.append("<p class='note'>no loss or learning-rate history was logged to MLflow for this workflow</p>")
    for run in page.training_runs:
        interesting = {
            k: v for k, v in run.params.items() if k in ("learning_rate", "max_steps", "lora_rank", "base_model")
        }
        params = ", ".join(f"{k}={v}" for k, v in interesting.items())
        parts.append(
            f"<p class='muted'>MLflow run {link(run.url, run.run_id) if run.url else f'<code>{esc(run.run_id)}</code>'}"
            f" {esc(run.name)} ({esc(run.status)}){': ' + esc(params) if params else ''}</p>"
        )
    return "".join(parts) + "</section>"


def _metric_rows(report: Mapping[str, Any]) -> tuple[str, dict[str, dict[str, float]], dict[str, float]]:
    """The metrics table's rows, the bar chart's values (metrics on [0, 1]) and its threshold marks."""
    metrics = {k: v for k, v in (report.get("metrics") or {}).items() if isinstance(v, (int, float))}
    champion = report.get("champion") or {}
    names = [k for k in metrics if not k.startswith("base_") and not k.endswith("_gain") and k != "gate_passed"]
    rows, bars = [], {}
    for name in names:
        tuned, base = metrics.get(name), metrics.get(f"base_{name}")
        gain = metrics.get(f"{name}_gain", tuned - base if tuned is not None and base is not None else None)
        champ = champion.get("champion_score") if champion.get("metric") == name else None
        better = None
        if isinstance(gain, (int, float)) and math.isfinite(gain) and gain:
            better = (gain < 0) if LOWER_IS_BETTER.search(name) else (gain > 0)
        css = "" if better is None else ("good" if better else "bad")
        rows.append(
            f"<tr><td>{esc(name)}</td><td class='num'>{number(base)}</td><td class='num'>{number(tuned)}</td>"
            f"<td class='num {css}'>{'' if gain is None else ('+' if gain > 0 else '') + number(gain)}</td>"
            f"<td class='num'>{number(champ)}</td></tr>"
        )
        values = {"base": base, "tuned": tuned, "champion": champ}
        finite = [v for v in values.values() if isinstance(v, (int, float)) and math.isfinite(v)]
        if finite and all(0.0 <= v <= 1.0 for v in finite) and not LOWER_IS_BETTER.search(name):
            bars[name] = {k: float(v) for k, v in values.items() if isinstance(v, (int, float))}
    marks = {
        str(t.get("metric")): float(t["value"])
        for t in report.get("thresholds") or []
        if isinstance(t, Mapping) and t.get("op") in (">=", ">") and isinstance(t.get("value"), (int, float))
    }
    return "".join(rows), bars, marks


def _threshold_rows(report: Mapping[str, Any]) -> str:
    """Each threshold's result as the evaluation's gate judged it (its `ok`; anything else fails closed)."""
    rows = []
    for rule in report.get("thresholds") or []:
        if not isinstance(rule, Mapping):
            continue
        actual, value, op = rule.get("actual"), rule.get("value"), str(rule.get("op", ">="))
        ok = rule.get("ok") is True
        rows.append(
            f"<tr><td class='mono'>{esc(rule.get('metric'))} {esc(op)} {esc(value)}</td>"
            f"<td class='num'>{number(actual)}</td>"
            f"<td class='{'good' if ok else 'bad'}'>{'pass' if ok else 'FAIL'}</td></tr>"
        )
    return "".join(rows)


def _evaluation(evaluation: Evaluation) -> str:
    task, report = evaluation.task, evaluation.report
    head = f"<section><h2>Evaluation <span class='muted'>({esc(task.name)})</span> {badge(task.phase)}</h2>"
    if report is None:
        why = evaluation.problem or task.message or "the task did not run"
        return head + f"<p class='note'>no evaluation report: {esc(why)}</p></section>"
    rows, bars, marks = _metric_rows(report)
    champion = report.get("champion") or {}
    groups = ["base", "tuned"] + (["champion"] if any("champion" in v for v in bars.values()) else [])
    passed = bool(report.get("passed"))
    parts = [
        head,
        f"<div class='decision {'pass' if passed else 'fail'}'>gate {'PASSED' if passed else 'FAILED'}: "
        f"{esc(report.get('reason', ''))}</div>",
        f"<p class='muted'>{esc(report.get('examples', '?'))} held-out examples, eval set "
        f"<code>{esc(str(report.get('eval_set_digest', ''))[:24])}</code></p>",
    ]
    if bars:
        parts.append(f"<div class='charts'>{svg.bar_chart('base vs tuned', bars, groups, marks)}</div>")
    parts.append(
        "<table><tr><th>metric</th><th>base</th><th>tuned</th><th>gain</th><th>champion</th></tr>" + rows + "</table>"
    )
    thresholds = _threshold_rows(report)
    if thresholds:
        parts.append(
            f"<h3>gate thresholds</h3><table><tr><th>rule</th><th>actual</th><th>result</th></tr>{thresholds}</table>"
        )
    if champion.get("reason"):
        parts.append(f"<p><b>champion:</b> {esc(champion['reason'])}</p>")
    samples = [s for s in report.get("samples") or [] if isinstance(s, Mapping)]
    if samples:
        parts.append(
            "<h3>sample answers</h3><table><tr><th>prompt</th><th>reference</th><th>base</th><th>tuned</th></tr>"
        )
        for s in samples:
            reference = str(s.get("reference", ""))
            cells = []
            for key in ("prompt", "reference", "base", "tuned"):
                text = str(s.get(key, ""))
                mark = ""
                if key in ("base", "tuned"):
                    mark = " good" if text.strip() == reference.strip() else ""
                cells.append(f"<td class='text{mark}'>{esc(svg.clip(text, SAMPLE_CHARS))}</td>")
            parts.append(f"<tr>{''.join(cells)}</tr>")
        parts.append("</table>")
    return "".join(parts) + "</section>"


def _validation(validation: Validation) -> str:
    task, summary = validation.task, validation.summary
    parts = [f"<section><h2>Data validation <span class='muted'>({esc(task.name)})</span> {badge(task.phase)}</h2>"]
    if summary is None:
        why = validation.problem or task.message or "the task did not run"
        parts.append(f"<p class='note'>no validation report: {esc(why)}</p>")
    else:
        checks = [c for c in summary.get("checks") or [] if isinstance(c, Mapping)]
        failed = [c for c in checks if not c.get("success")]
        rows = summary.get("rows") or {}
        split_rows = ", ".join(f"{esc(k)}: {esc(v)} rows" for k, v in rows.items())
        verdict = "good" if not failed else "bad"
        parts.append(
            f"<p><span class='{verdict}'>{len(checks) - len(failed)} of {len(checks)} checks passed</span>"
            f" \u00b7 {split_rows} \u00b7 eval prompts also in train: {esc(summary.get('overlap', 0))}</p>"
        )
        if failed:
            parts.append("<table><tr><th>split</th><th>check</th><th>unexpected</th><th>detail</th></tr>")
            for c in failed:
                counts = f"{c.get('unexpected_count')} of {c.get('checked_count')}" if c.get("checked_count") else ""
                detail = "\n".join([str(c.get("detail") or ""), *map(str, c.get("examples") or [])]).strip()
                parts.append(
                    f"<tr><td>{esc(c.get('split'))}</td><td class='mono'>{esc(c.get('check'))}</td>"
                    f"<td class='num'>{esc(counts)}</td><td class='text'>{esc(detail)}</td></tr>"
                )
            parts.append("</table>")
    if validation.docs_href:
        parts.append(
            f"<p>great-expectations {link(validation.docs_href, 'Data Docs')} "
            f"<span class='muted mono'>{esc(validation.docs_path)}</span></p>"
        )
    elif validation.docs_path:
        parts.append(f"<p class='muted'>Data Docs: <code>{esc(validation.docs_path)}</code></p>")
    return "".join(parts) + "</section>"


def _outputs_table(task: Task) -> str:
    rows = "".join(f"<tr><th>{esc(k)}</th><td class='mono'>{_value(v)}</td></tr>" for k, v in task.outputs.items())
    return f"<table>{rows}</table>" if rows else ""


def _registry(page: Page) -> str:
    if not page.registrations and not page.rollouts:
        return ""
    parts = ["<section><h2>Model registry and rollout</h2>"]
    for task in page.registrations:
        out = task.outputs
        if task.phase == "Succeeded" and out.get("model_version"):
            where = out.get("model_version_url", "")
            version = (
                link(where, f"version {out['model_version']}") if where else esc(f"version {out['model_version']}")
            )
            parts.append(f"<p>registered <b>{version}</b> <code>{esc(out.get('model_uri', ''))}</code></p>")
        else:
            why = f": {task.message}" if task.message else ""
            parts.append(f"<p class='note'>{esc(task.name)} {badge(task.phase)} nothing registered{esc(why)}</p>")
    for task in page.rollouts:
        duration = format_duration(task.duration_s(page.now))
        lane = " (exit handler)" if task.dag == EXIT else ""
        parts.append(
            f"<h3>{esc(task.name)}{esc(lane)} {badge(task.phase)} <span class='muted'>{esc(duration)}</span></h3>"
            + (f"<p class='muted'>{esc(task.message)}</p>" if task.message else "")
            + _outputs_table(task)
        )
    return "".join(parts) + "</section>"


def _value(value: str) -> str:
    shown = value
    if value.startswith(("{", "[")):
        try:
            shown = json.dumps(json.loads(value), indent=1)
        except ValueError:
            shown = value
    if len(shown) <= VALUE_CHARS and "\n" not in shown:
        return esc(shown)
    return f"<details><summary>{esc(svg.clip(value, 80))}</summary><div class='text'>{esc(shown)}</div></details>"


def _tasks(page: Page) -> str:
    rows = []
    for task in page.facts.tasks:
        outputs = "<br>".join(f"<b>{esc(k)}</b> = {_value(v)}" for k, v in task.outputs.items())
        rows.append(
            f"<tr><td><b>{esc(task.name)}</b>{'<br><span class=muted>exit handler</span>' if task.dag == EXIT else ''}"
            f"</td><td>{badge(task.phase)}</td><td class='num'>{esc(format_duration(task.duration_s(page.now)))}</td>"
            f"<td class='mono'>{esc(task.step or task.template)}</td><td>{esc(task.message)}</td>"
            f"<td class='mono'>{outputs}</td></tr>"
        )
    return (
        "<section><h2>Tasks and outputs</h2><table><tr><th>task</th><th>phase</th><th>duration</th><th>step</th>"
        "<th>message</th><th>outputs</th></tr>" + "".join(rows) + "</table></section>"
    )


def _mlflow(page: Page) -> str:
    if not page.ended_runs and not page.notes:
        return ""
    parts = ["<section><h2>Bookkeeping</h2>"]
    if page.ended_runs:
        items = "".join(
            f"<li><code>{esc(r.run_id)}</code> {esc(r.name)} \u2192 <b>{esc(r.status)}</b></li>"
            for r in page.ended_runs
        )
        parts.append(f"<p>MLflow runs this workflow left open, now ended:</p><ul>{items}</ul>")
    if page.notes:
        parts.append("<ul>" + "".join(f"<li class='note'>{esc(n)}</li>" for n in page.notes) + "</ul>")
    return "".join(parts) + "</section>"
