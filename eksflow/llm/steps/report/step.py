"""The report step's driver: read the workflow, end its MLflow runs, gather each section's data, write the page."""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from eksflow.llm.steps.common import tracking
from eksflow.llm.steps.common.kube_api import ApiAccess, KubeApiError
from eksflow.llm.steps.report import REPORT_FILE, Args, Outputs
from eksflow.llm.steps.report.canary_steps import CanaryStep, percent_of, report_file
from eksflow.llm.steps.report.collect import (
    RunFacts,
    Task,
    arg_path,
    canary_tasks,
    collect,
    evaluation_tasks,
    registration_tasks,
    rollout_tasks,
    run_ids,
    training_run_ids,
    training_tasks,
    validation_tasks,
)
from eksflow.llm.steps.report.html import Evaluation, Page, Validation, render
from eksflow.llm.steps.report.runs import (
    EndedRun,
    TrainingRun,
    end_runs,
    log_page,
    read_training_runs,
    workflow_run_ids,
)
from eksflow.llm.steps.report.workflow import fetch_workflow, host_paths, read_local
from eksflow.runtime.args import run_step
from eksflow.runtime.outputs import atomic_write_text
from eksflow.runtime.rundir import local_run_dir

FINAL_PHASES = ("Succeeded", "Failed", "Error")
VALIDATION_FILE = (
    "validation.json"  # eksflow.llm.steps.validate_data.REPORT_FILE, not imported: that pulls its settings in
)
DATA_DOCS_INDEX = "data_docs/index.html"


def run(args: Args) -> Outputs:
    """Write the page (local run folder, else `report_dir`) and its artifact copy; end the workflow's runs."""
    local = local_run_dir()
    try:
        workflow = read_local(local) if local else fetch_workflow(args.workflow_name, ApiAccess.in_cluster())
    except KubeApiError:  # the workflow unavailable, or no API to ask
        # No page without the workflow, but the runs it started must still end.
        if args.tracking_uri and args.workflow_status in FINAL_PHASES:
            tagged = workflow_run_ids(args.tracking_uri, args.workflow_name)
            end_runs(args.tracking_uri, tagged, succeeded=args.workflow_status == "Succeeded")
        raise
    facts = collect(workflow, args.workflow_status)
    to_host: Callable[[str], str] = host_paths(workflow, local) if local else (lambda path: path)
    page_path = (local if local else args.report_dir) / REPORT_FILE
    notes: list[str] = []
    runs: list[TrainingRun] = []
    ended: list[EndedRun] = []
    failure: tracking.TrackingError | None = None
    all_ids = run_ids(facts)
    if args.tracking_uri:
        runs, ended, failure = _mlflow(args, facts, all_ids, notes)
    page = Page(
        facts=facts,
        now=datetime.now(timezone.utc),
        training_tasks=training_tasks(facts),
        training_runs=runs,
        evaluations=[_evaluation(t, to_host) for t in evaluation_tasks(facts)],
        validations=[_validation(t, facts.name, to_host, page_path.parent) for t in validation_tasks(facts)],
        registrations=registration_tasks(facts),
        rollouts=rollout_tasks(facts),
        canary_steps=[_canary(t, facts.name, to_host) for t in canary_tasks(facts)],
        ended_runs=ended,
        notes=notes,
    )
    page_path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(page_path, render(page))
    args.outputs_dir.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(
        page_path, args.outputs_dir / REPORT_FILE
    )  # the Argo output artifact (eksflow.llm.steps.report.ARTIFACTS)
    print(f"report: {page_path}", file=sys.stderr)
    logged_to = (training_run_ids(facts) or [r.run_id for r in runs] or all_ids)[:1]
    if args.tracking_uri and logged_to:
        log_page(args.tracking_uri, logged_to[0], page_path)
    if failure is not None:
        raise failure  # after the page: it says which runs were left open, and Argo retries this task
    return Outputs(report=str(page_path), ended_runs=[r.run_id for r in ended])


def _mlflow(
    args: Args, facts: RunFacts, all_ids: Sequence[str], notes: list[str]
) -> tuple[list[TrainingRun], list[EndedRun], tracking.TrackingError | None]:
    """End the workflow's open runs, then read the curves (the page shows each run's status after that).

    Problems reading become notes; a failure to end runs is also returned, to fail the task after the page.
    """
    try:
        tagged = workflow_run_ids(args.tracking_uri, facts.name)
    except tracking.TrackingError as err:
        notes.append(str(err))
        tagged = []
    open_ids = list(dict.fromkeys([*all_ids, *tagged]))
    ended: list[EndedRun] = []
    failure: tracking.TrackingError | None = None
    if facts.phase not in FINAL_PHASES:
        if open_ids:
            notes.append(f"the workflow is {facts.phase}: its MLflow runs were left as they are")
    else:
        try:
            ended = end_runs(args.tracking_uri, open_ids, succeeded=facts.phase == "Succeeded", kept=all_ids)
        except tracking.TrackingError as err:
            notes.append(f"MLflow runs {', '.join(open_ids)} could not be ended: {err}")
            failure = err
    # A failed train task wrote no output, but its run (found by tag) holds the curve up to the failure.
    plotted = list(dict.fromkeys([*training_run_ids(facts), *tagged]))
    runs, problems = read_training_runs(args.tracking_uri, args.mlflow_ui_url, plotted)
    notes += problems
    return runs, ended, failure


def _read_json(path: str, to_host: Callable[[str], str]) -> tuple[dict[str, Any] | None, str]:
    host = to_host(path)
    try:
        data = json.loads(Path(host).read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        return None, f"{path} could not be read: {err.__class__.__name__}: {str(err)[:200]}"
    if not isinstance(data, dict):
        return None, f"{path} does not hold a JSON object"
    return data, ""


def _evaluation(task: Task, to_host: Callable[[str], str]) -> Evaluation:
    path = task.outputs.get("report", "")
    if not path:
        return Evaluation(task, None, task.message or f"{task.name} is {task.phase}")
    report, problem = _read_json(path, to_host)
    return Evaluation(task, report, problem)


def _validation(task: Task, workflow_name: str, to_host: Callable[[str], str], page_dir: Path) -> Validation:
    # validation.json is written on failure too, when the output parameter is not: then --report-dir finds it.
    path = task.outputs.get("report") or arg_path(task, "report-dir", workflow_name, VALIDATION_FILE) or ""
    if not path or task.phase in ("Pending", "Skipped", "Omitted"):
        return Validation(task, None, problem=task.message or f"{task.name} is {task.phase}")
    summary, problem = _read_json(path, to_host)
    docs = f"{os.path.dirname(path)}/{DATA_DOCS_INDEX}"
    host_docs = Path(to_host(docs))
    href = os.path.relpath(host_docs, page_dir).replace(os.sep, "/") if host_docs.is_file() else ""
    return Validation(task, summary, docs_href=href, docs_path=docs if href or summary else "", problem=problem)


def _canary(task: Task, workflow_name: str, to_host: Callable[[str], str]) -> CanaryStep:
    # canary-<percent>.json is written on failure too, when the output parameter is not: then --report-dir finds it.
    if task.phase in ("Skipped", "Omitted"):
        return CanaryStep(task, None)
    if "report" in task.outputs and not task.outputs["report"]:  # passed without measuring (no champion served)
        return CanaryStep(task, None, problem=task.outputs.get("reason", ""))
    percent = percent_of(task)
    path = task.outputs.get("report") or (
        arg_path(task, "report-dir", workflow_name, report_file(percent)) if percent is not None else None
    )
    if not path:
        return CanaryStep(task, None, problem=f"{task.name} names no report file (--report-dir, --percent)")
    report, problem = _read_json(path, to_host)
    return CanaryStep(task, report, problem)


def main(argv: list[str] | None = None) -> int:
    """Entry point: `python -m eksflow.llm.steps.report --name=value ...`."""
    return run_step(Args, run, argv)
