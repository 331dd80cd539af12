"""What the evaluation leaves behind: eval_report.json, the markdown table, and the MLflow run's metrics and tags."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from eksflow.llm.steps.common import tracking
from eksflow.llm.steps.common.data import Example
from eksflow.llm.steps.common.evaluation import REPORT_ARTIFACT, REPORT_FILE
from eksflow.llm.steps.common.gate import Verdict
from eksflow.llm.steps.evaluate import Args
from eksflow.llm.steps.evaluate import metrics as task_metrics
from eksflow.llm.steps.evaluate.gate import LOSS_METRICS, ChampionCheck
from eksflow.llm.steps.evaluate.preference import PREFERENCE_METRICS
from eksflow.llm.steps.evaluate.scoring import Scores

TABLE_FILE = "eval_report.md"


EVAL_SET_TAG = "eval_set_digest"  # on the run (this step) and on the model version (register)


def write_report(
    args: Args,
    examples: Sequence[Example],
    scores: Mapping[str, Scores],
    metrics: Mapping[str, float],
    verdict: Verdict,
    digest: str,
    check: ChampionCheck,
    intervals: Mapping[str, Sequence[float]] | None = None,
    total: int = 0,
) -> Path:
    """Write eval_report.json and eval_report.md, and print the table.

    `verdict` is the decision, the champion comparison included, with the thresholds' results as the gate judged them.
    `intervals` (a sampled set: the Wilson intervals of the task metrics) and `total` (the usable examples the
    set holds) go into both reports.
    """
    args.report_dir.mkdir(parents=True, exist_ok=True)
    samples = [
        {"prompt": e.prompt, "reference": e.completion, "base": b, "tuned": t}
        for e, b, t in zip(examples[:8], scores["base"].answers, scores["tuned"].answers, strict=False)
    ]
    # Per-row scores of the tuned model: the canary checks that the served model scores the same rows alike (RO3),
    # asking a conversation's row with the history ("messages") it was asked here.
    scorers = {name: task_metrics.resolve(name) for name in args.task_metrics}
    rows = [
        {"prompt": e.prompt, "reference": e.completion, "answer": a}
        | ({"messages": e.history()} if e.messages else {})
        | {name: scorer(a, e.completion) for name, scorer in scorers.items()}
        for e, a in zip(examples, scores["tuned"].answers, strict=False)
    ]
    report = {
        "passed": verdict.passed,
        "reason": verdict.reason,
        "metrics": dict(metrics),
        "thresholds": [result.report() for result in verdict.results],
        "champion": {**check.model_dump(), "rule_metric": args.champion_metric, "margin": args.champion_margin},
        "eval_set_digest": digest,
        "examples": len(examples),
        "task_metrics": list(args.task_metrics),
        "max_new_tokens": scores["tuned"].max_new_tokens,  # the answers' cap, which the canary's probes keep
        "eval_set_examples": total or len(examples),
        "confidence": {"level": args.confidence, "intervals": dict(intervals)} if intervals else None,
        "adapter_dir": str(args.adapter_dir),
        "samples": samples,
        "rows": rows,
    }
    path = args.report_dir / REPORT_FILE
    path.write_text(json.dumps(report, indent=2), encoding="utf-8")
    table = render_table(metrics, args.task_metrics, verdict, len(examples), check)
    if intervals:
        shown = ", ".join(f"{name} [{low:.4f}, {high:.4f}]" for name, (low, high) in intervals.items())
        table += (
            f"\n\nsampled {len(examples)} of {total} held-out examples (seed {args.sample_seed}); "
            f"{args.confidence:.0%} Wilson intervals: {shown}"
        )
    (args.report_dir / TABLE_FILE).write_text(table + "\n", encoding="utf-8")
    print(table)
    return path


def render_table(
    metrics: Mapping[str, float],
    task_metrics: Sequence[str],
    verdict: Verdict,
    n_examples: int,
    check: ChampionCheck | None = None,
) -> str:
    """A markdown table of base vs tuned metrics, the thresholds' results, the champion comparison and the decision."""
    lines = [f"held-out examples: {n_examples}", "", "| metric | base | tuned | gain |", "|---|---|---|---|"]
    for name in [*LOSS_METRICS, *task_metrics, *(m for m in PREFERENCE_METRICS if m in metrics)]:
        base, tuned = metrics.get(f"base_{name}", math.nan), metrics.get(name, math.nan)
        lines.append(f"| {name} | {base:.4f} | {tuned:.4f} | {tuned - base:+.4f} |")
    lines += ["", "| threshold | actual | result |", "|---|---|---|"]
    lines += [result.table_row() for result in verdict.results]
    if check is not None and check.applied and check.required is not None:
        actual = math.nan if check.actual is None else check.actual
        op = "<=" if check.metric in LOSS_METRICS else ">="
        lines.append(
            f"| {check.metric} {op} {check.required:g} (champion v{check.version}) | {actual:.4f} | "
            f"{'pass' if check.passed else 'FAIL'} |"
        )
    elif check is not None:
        lines += ["", f"champion: {check.reason}"]
    lines += ["", f"gate: {'PASSED' if verdict.passed else 'FAILED'} ({verdict.reason})"]
    return "\n".join(lines)


def log_to_run(
    args: Args,
    metrics: Mapping[str, float],
    passed: bool,
    reason: str,
    digest: str,
    check: ChampionCheck,
    report: Path,
) -> None:
    """Log metrics as metrics; thresholds, champion rule and decision as tags, both reports as artifacts.

    Tags, not params: params are write-once, and a rerun with changed thresholds must still record what decided.
    """
    uri, run_id = args.tracking_uri, args.mlflow_run_id
    numbers = {**metrics, "gate_passed": float(passed)}
    if check.champion_score is not None:
        numbers["champion_" + check.metric] = check.champion_score
    tracking.log_metrics(uri, run_id, numbers)
    tracking.set_tags(
        uri,
        run_id,
        {
            EVAL_SET_TAG: digest,
            "gate.decision": "passed" if passed else "failed",
            "gate.reason": reason,
            "gate.thresholds": json.dumps([r.describe() for r in args.thresholds]),
            "gate.champion_rule": f"{args.champion_metric} margin {args.champion_margin:g}",
            "gate.champion_version": check.version,
            "gate.champion_applied": str(check.applied).lower(),
            "eval.task_metrics": ",".join(args.task_metrics),
        },
    )
    tracking.log_files(uri, run_id, [report, report.with_name(TABLE_FILE)], REPORT_ARTIFACT)
