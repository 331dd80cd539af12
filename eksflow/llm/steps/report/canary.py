"""The canary section: every analysis step of the rollout as one picture, a verdict and a table. Pure: data in, text.

A rollout is judged step by step (eksflow/llm/steps/canary/: analyze-0 before any traffic, then one analysis per
weight), so the page lays the steps out as columns and the quantities a reader compares across them as rows: the
candidate's observed share of live traffic beside the weight it was given, its served score beside what `evaluate`
measured and the champion's, the error rates, the p95 latency. A failed step's column is outlined and named in the
verdict with its failing rules; steps that never ran are greyed out, never drawn as zeros. A value the analysis could
not measure (NaN in the report, e.g. the share at 0 %) reads `n/a` in the picture and a dash in the table: a missing
bar is not a zero bar.

Each step's report is the JSON eksflow.llm.steps.canary.report.write_report leaves in --report-dir
(canary-<percent>.json, written on failure too); step.py reads it, canary_steps.py checks it, canary_picture.py
draws it. Each rule's result is printed as the analysis judged it (its `ok`), never judged again here. Every text
goes through `esc`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from eksflow.llm.steps.report.canary_picture import picture
from eksflow.llm.steps.report.canary_steps import FAILED, NOT_RUN, PASSED, CanaryStep, mapping, plain
from eksflow.llm.steps.report.collect import MAIN, Task
from eksflow.llm.steps.report.svg import clip, esc

NOTE_CHARS = 600


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
            f"{rule} ({'not measured' if actual is None else f'actual {plain(actual)}'})"
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
        versions = [str(mapping(s.report.get("candidate")).get("version", "")) for s in steps if s.report]
        who = f"candidate v{versions[-1]}" if versions and versions[-1] else "the candidate"
        return f"<div class='decision pass'>promoted: {esc(who)} passed every canary step</div>"
    idle = [s for s in steps if s.state != PASSED]
    if len(idle) == len(steps):
        return f"<p class='note'>the canary did not run: {esc(idle[0].note())}</p>"
    return f"<p class='note'>no canary step failed; not finished: {esc(', '.join(s.task.name for s in idle))}</p>"


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
        f"<td class='num'>{esc(mapping(s.report.get('live_traffic')).get('requests', ''))}</td>"
        if s.report
        else "<td></td>"
        for s in steps
    )
    body.append(f"<tr><td>live requests</td>{requests}</tr>")
    failing = [{metric for metric, _, _ in s.failing_rules()} for s in steps]
    named = next((s for s in steps if s.report is not None), None)  # the steps of one rollout share their metric
    for name, shown in TABLE_METRICS:
        cells = []
        for step, bad in zip(steps, failing, strict=True):
            value = step.metric(name)
            if step.report is None:
                cells.append("<td></td>")
            elif value is None:
                cells.append("<td class='num muted' title='not measured'>\u2013</td>")
            else:
                cells.append(f"<td class='num{' bad' if name in bad else ''}'>{esc(plain(value, shown))}</td>")
        body.append(f"<tr><td class='mono'>{esc(named.shown(name) if named else name)}</td>{''.join(cells)}</tr>")
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
        live = mapping(step.report.get("live_traffic"))
        served = ", ".join(f"{k} {v}" for k, v in sorted(mapping(live.get("served_by")).items(), key=str))
        asked = []
        for role, raw in mapping(step.report.get("probes_asked")).items():
            how = mapping(raw)
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
