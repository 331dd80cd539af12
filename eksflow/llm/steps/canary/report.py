"""The canary step's report: canary-<percent>.json (everything) and .md (the table), and the version's MLflow run."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path

from eksflow.llm.steps.canary import Args, metric_labels
from eksflow.llm.steps.canary.fleet import FleetNote
from eksflow.llm.steps.canary.traffic import Asked, Measurement
from eksflow.llm.steps.common import rollout, tracking
from eksflow.llm.steps.common.canary_sizing import Sizing
from eksflow.llm.steps.common.gate import Verdict
from eksflow.llm.steps.common.rollout import RolloutState

REPORT_ARTIFACTS = "canary"


def write_report(
    args: Args,
    state: RolloutState,
    task_metric: str,
    verdict: Verdict,
    sizing: Sizing,
    measured: Measurement,
    fleet: FleetNote,
) -> Path:
    """canary-<percent>.json (everything) and .md (the table), in --report-dir; prints the table."""
    args.report_dir.mkdir(parents=True, exist_ok=True)
    stem = args.report_dir / f"canary-{args.percent:g}"
    served_by: dict[str, int] = {}
    for answer in measured.live:
        key = answer.served_by or f"error {answer.status}"
        served_by[key] = served_by.get(key, 0) + 1
    metrics = measured.metrics
    report = {
        "passed": verdict.passed,
        "reason": verdict.reason,
        "percent": args.percent,
        "task_metric": task_metric,  # what the score metrics (SCORE_METRICS) are in
        "shown": metric_labels(task_metric),  # how a metric is named wherever it is shown
        "candidate": {"version": state.candidate_version, "slot": state.candidate_slot},
        "champion": {"version": state.champion_version, "slot": state.champion_slot},
        "metrics": {k: (v if math.isfinite(v) else str(v)) for k, v in metrics.items()},
        "rules": [result.report() for result in verdict.results],
        "live_traffic": {"requests": len(measured.live), "sized": sizing.describe(), "served_by": served_by},
        "probes_asked": {role: asdict(a) for role, a in measured.asked.items()},
        "probes": [p.model_dump() for p in measured.probes],
        "fleet": fleet.report(),
    }
    json_path = stem.with_suffix(".json")
    json_path.write_text(json.dumps(report, indent=2, default=str), encoding="utf-8")
    evidence = [f"live traffic: {sizing.describe()}", "probes: " + describe_asked(measured.asked), *fleet.lines()]
    table = render_table(args.percent, state, task_metric, metrics, verdict, served_by, evidence)
    stem.with_suffix(".md").write_text(table + "\n", encoding="utf-8")
    print(table)
    return json_path


def render_table(
    percent: float,
    state: RolloutState,
    task_metric: str,
    metrics: Mapping[str, float],
    verdict: Verdict,
    served_by: Mapping[str, int],
    evidence: Sequence[str] = (),
) -> str:
    """The markdown summary: traffic split, what was sent and why, every rule's result as decided, the decision.

    Every score metric is shown with the task metric it is in: `served_score (sql_exact)`.
    """
    labels = metric_labels(task_metric)
    champion = f"v{state.champion_version} ({state.champion_slot})" if state.champion_slot else "none served"
    lines = [
        f"canary at {percent:g}%: candidate v{state.candidate_version} ({state.candidate_slot}), champion {champion}",
        "",
        f"scores: {task_metric} on the probe rows",
        "",
        "live traffic served by: " + ", ".join(f"{k} {v}" for k, v in sorted(served_by.items())),
        *(part for line in evidence for part in ("", line)),
        "",
        "| rule | actual | result |",
        "|---|---|---|",
    ]
    lines += [result.table_row(labels.get(result.rule.metric, "")) for result in verdict.results]
    others = [k for k in metrics if k not in {r.rule.metric for r in verdict.results}]
    lines += ["", ", ".join(f"{labels.get(k, k)} = {metrics[k]:.4f}" for k in others)]
    lines += ["", f"analysis: {'PASSED' if verdict.passed else 'FAILED'} ({verdict.reason})"]
    return "\n".join(lines)


def describe_asked(asked: Mapping[str, Asked]) -> str:
    """`candidate 16 sent (0 failed), champion reused from analyze-10`."""
    return ", ".join(
        f"{role} reused from {a.reused_from}" if a.reused_from else f"{role} {a.sent} sent ({a.errors} failed)"
        for role, a in asked.items()
    )


def log_to_mlflow(args: Args, version: str, metrics: Mapping[str, float], report: Path) -> None:
    """Metrics and both report files on the version's run (best effort: the analysis already decided)."""
    try:
        run_id = str(tracking.client(args.tracking_uri).get_model_version(args.model_name, version).run_id)
    except Exception as err:  # a report that cannot be logged must not change the decision
        rollout.log(f"warning: not logging the canary report to MLflow: {err}")
        return
    prefix = f"canary_{args.percent:g}_"
    tracking.log_metrics(args.tracking_uri, run_id, {prefix + k: v for k, v in metrics.items() if math.isfinite(v)})
    tracking.log_files(args.tracking_uri, run_id, [report, report.with_suffix(".md")], REPORT_ARTIFACTS)
