"""Run folders of the flagship as the local executor leaves them, for the report's tests: no model runs.

`make_run` writes `<state>/runs/<name>/manifest.yaml` (the real flagship manifest, report task included) and a
status.json in the executor's format for one scenario, plus the files the steps would have written on the FSx
volume (`<state>/volumes/<claim>/runs/<name>/...`): evaluate's eval_report.json, validate's validation.json and
Data Docs. Hostile strings can be put everywhere a user or a model controls text.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml

from eksflow.llm.steps.report.collect import (
    collect,
    evaluation_tasks,
    registration_tasks,
    rollout_tasks,
    training_tasks,
    validation_tasks,
)
from eksflow.llm.steps.report.html import Page, render
from eksflow.llm.steps.report.runs import EndedRun, TrainingRun
from eksflow.llm.steps.report.step import _evaluation, _validation
from eksflow.llm.steps.report.workflow import host_paths, read_local
from tests.flagship import config, rendered

NAME = "llama-lora-t3st1"
HOSTILE = "<script>alert('x')</script>\"'><img src=x onerror=alert(1)>&amp;]]>{{workflow.name}}"
SCENARIOS = ("succeeded", "failed", "skipped", "invalid-data")


def stamp(minute: int, second: int = 0) -> str:
    return f"2026-05-01T10:{minute:02d}:{second:02d}Z"


def node(name: str, phase: str, start: int | None, end: int | None, outputs: dict[str, str] | None = None, **extra):
    return {
        "displayName": name,
        "templateName": name.removeprefix("onExit."),
        "phase": phase,
        "message": extra.get("message", ""),
        "exitCode": extra.get("exit_code"),
        "startedAt": None if start is None else stamp(start),
        "finishedAt": None if end is None else stamp(end),
        "progress": None,
        "retries": 0,
        "outputs": {"parameters": [{"name": k, "value": v} for k, v in (outputs or {}).items()]},
    }


def eval_report(hostile: bool) -> dict[str, Any]:
    text = HOSTILE if hostile else ""
    return {
        "passed": True,
        "reason": "all thresholds met: exact_match >= 0.6, exact_match_gain >= 0.2" + text,
        "metrics": {
            "eval_loss": 0.41,
            "perplexity": 1.51,
            "exact_match": 0.875,
            "contains": 0.9375,
            "base_eval_loss": 2.3,
            "base_perplexity": 9.97,
            "base_exact_match": 0.0625,
            "base_contains": 0.25,
            "exact_match_gain": 0.8125,
            "contains_gain": 0.6875,
        },
        "thresholds": [
            {"metric": "exact_match", "op": ">=", "value": 0.6, "actual": 0.875, "ok": True},
            {"metric": "exact_match_gain", "op": ">=", "value": 0.2, "actual": 0.8125, "ok": True},
        ],
        "champion": {
            "applied": True,
            "passed": True,
            "reason": "beats champion v2 (exact_match 0.7500, margin 0): exact_match >= 0.75",
            "version": "2",
            "metric": "exact_match",
            "champion_score": 0.75,
            "required": 0.75,
            "actual": 0.875,
            "rule_metric": "exact_match",
            "margin": 0.0,
        },
        "eval_set_digest": "sha256:0f3a9c",
        "examples": 16,
        "adapter_dir": "/fsx/runs/x/train/checkpoints/step-24/adapter",
        "samples": [
            {
                "prompt": "Rewrite this date in ISO 8601 format.\nDate: July 4, 1976" + text,
                "reference": "1976-07-04",
                "base": "The date is July 4th" + text,
                "tuned": "1976-07-04",
            },
            {"prompt": "Date: 3 Feb 2001", "reference": "2001-02-03", "base": "", "tuned": "2001-02-03"},
        ],
    }


def validation_report(success: bool, hostile: bool) -> dict[str, Any]:
    checks = [
        {
            "split": "train",
            "check": "row_count",
            "expectation": "expect_table_row_count_to_be_between",
            "success": True,
        },
        {"split": "eval", "check": "row_count", "expectation": "expect_table_row_count_to_be_between", "success": True},
    ]
    if not success:
        checks.append(
            {
                "split": "train",
                "check": "completion_not_blank",
                "expectation": "expect_column_values_to_match_regex",
                "success": False,
                "unexpected_count": 3,
                "checked_count": 64,
                "examples": ["line 7: '   '" + (HOSTILE if hostile else "")],
                "detail": "",
            }
        )
    return {
        "success": success,
        "dataset_dir": "/fsx/runs/x/data",
        "rows": {"train": 64, "eval": 16},
        "overlap": 0,
        "settings": {"mostly": 1.0},
        "checks": checks,
    }


@functools.cache
def manifest_text() -> str:
    """The flagship's manifest as the executor saves it (rendered once: building the pipeline takes a second)."""
    return yaml.safe_dump(rendered(), sort_keys=False)


def make_run(
    state_dir: Path, scenario: str = "succeeded", *, hostile: bool = False, run_id: str = "", name: str = NAME
) -> Path:
    """Write the run folder of workflow `name` for `scenario` (one of SCENARIOS) and return it."""
    cfg = config()
    run_dir = state_dir / "runs" / name
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    (run_dir / "manifest.yaml").write_text(manifest_text(), encoding="utf-8")
    fsx = cfg.storage.fsx_mount
    run_fsx = f"{fsx}/runs/{name}"
    host = state_dir / "volumes" / cfg.storage.fsx_claim / "runs" / name
    reports = host / "reports"
    (reports / "data_docs").mkdir(parents=True, exist_ok=True)
    (reports / "data_docs" / "index.html").write_text("<html><body>Data Docs</body></html>", encoding="utf-8")
    valid = scenario != "invalid-data"
    (reports / "validation.json").write_text(json.dumps(validation_report(valid, hostile)), encoding="utf-8")
    text = HOSTILE if hostile else ""
    nodes = {
        "champion": node("champion", "Succeeded", 0, 1, {"version": "2", "dataset_digest": ""}),
        "stage-data": node(
            "stage-data",
            "Succeeded",
            1,
            2,
            {
                "dataset_dir": f"{run_fsx}/data",
                "dataset_digest": "sha256:d1",
                "changed": str(scenario != "skipped").lower(),
                "reason": "data unchanged since champion v2 (sha256:d1)"
                if scenario == "skipped"
                else "data changed since champion v2",
            },
        ),
    }
    if not valid:
        nodes["validate-data"] = node(
            "validate-data", "Failed", 2, 3, message="exit code 2: error: dataset failed validation" + text
        )
        for later in ("train", "evaluate", "register", "promote"):
            nodes[later] = node(later, "Omitted", None, None, message="depends 'validate-data.Succeeded' is false")
    else:
        nodes["validate-data"] = node(
            "validate-data",
            "Succeeded",
            2,
            3,
            {"train_rows": "64", "eval_rows": "16", "report": f"{run_fsx}/reports/validation.json"},
        )
    if scenario == "skipped":
        # as Argo says it: the page reads the reason from the template's annotation and stage-data's output
        nodes["train"] = node("train", "Skipped", None, None, message="when 'false == true' evaluated false")
        for later in ("evaluate", "register", "promote"):
            nodes[later] = node(later, "Omitted", None, None, message="depends 'train.Succeeded' is false")
    elif valid:
        nodes["train"] = node(
            "train",
            "Succeeded",
            3,
            9,
            {
                "adapter_dir": f"{run_fsx}/train/checkpoints/step-24/adapter",
                "checkpoint_dir": f"{run_fsx}/train/checkpoints/step-24",
                "final_loss": "0.3125",
                "tokens_per_s": "812.5",
                "mlflow_run_id": run_id,
            },
        )
        if scenario == "failed":
            nodes["evaluate"] = node("evaluate", "Failed", 9, 12, message="exit code 1: error: MLflow down" + text)
            for later in ("register", "promote"):
                nodes[later] = node(later, "Omitted", None, None, message="depends 'evaluate.Succeeded' is false")
        else:
            (reports / "eval_report.json").write_text(json.dumps(eval_report(hostile)), encoding="utf-8")
            nodes["evaluate"] = node(
                "evaluate",
                "Succeeded",
                9,
                12,
                {
                    "passed": "true",
                    "reason": "all thresholds met",
                    "report": f"{run_fsx}/reports/eval_report.json",
                    "metrics": json.dumps(eval_report(False)["metrics"]),
                    "exact_match": "0.875",
                    "base_exact_match": "0.0625",
                    "eval_set_digest": "sha256:" + "0f3a9c5e" * 8,  # as long as a real one: no space to wrap at
                    "champion_version": "2",
                    "mlflow_run_url": "http://127.0.0.1:5000/#/experiments/584170369428532411/runs/"
                    "8f2c5a1d9b7e4f60a3c2d1e0f9b8a7c6",
                },
            )
            nodes["register"] = node(
                "register",
                "Succeeded",
                12,
                14,
                {
                    "model_version": "3",
                    "model_uri": "models:/llama-lora/3",
                    "mlflow_run_id": run_id,
                    "model_version_url": "http://mlflow.example.com/#/models/llama-lora/versions/3",
                },
            )
            nodes["promote"] = node(
                "promote",
                "Succeeded",
                14,
                16,
                {"answer": "1976-07-04" + text, "champion_version": "3", "previous_version": "2"},
            )
    nodes["onExit.report"] = node("onExit.report", "Running", 16, None)
    phase = "Succeeded" if scenario in ("succeeded", "skipped") else "Failed"
    status = {
        "metadata": {"name": name, "uid": "0000-1111", "namespace": "local"},
        "spec": {
            "arguments": {
                "parameters": [
                    {"name": "data_source", "value": "data/demo" + text},
                    {"name": "base_model", "value": "smollm2-135m-instruct"},
                    {"name": "retrain", "value": "always"},
                ]
            }
        },
        "status": {"phase": phase, "startedAt": stamp(0), "finishedAt": None, "message": "", "nodes": nodes},
    }
    (run_dir / "status.json").write_text(json.dumps(status, indent=1), encoding="utf-8")
    return run_dir


NOW = datetime(2026, 5, 1, 10, 20, tzinfo=timezone.utc)


def curves(run_id: str = "r1") -> TrainingRun:
    """A training run's loss and learning-rate history, as MLflow would return it."""
    steps = range(0, 25, 5)
    return TrainingRun(
        run_id=run_id,
        name="llama-lora-t3st1",
        status="RUNNING",
        url="",
        params={"learning_rate": "0.001", "max_steps": "24"},
        history={
            "loss": tuple((float(s), 2.5 - s / 12) for s in steps),
            "learning_rate": tuple((float(s), 1e-3 * (1 - s / 30)) for s in steps),
        },
    )


def page_of(
    tmp_path: Path,
    scenario: str,
    *,
    hostile: bool = False,
    runs: Sequence[TrainingRun] = (),
    ended: Sequence[EndedRun] = (),
) -> str:
    """The page of a `make_run` folder, rendered with the given training curves and ended runs (no MLflow)."""
    run_dir = make_run(tmp_path, scenario, hostile=hostile, run_id="r1")
    workflow = read_local(run_dir)
    facts = collect(workflow, "Succeeded" if scenario in ("succeeded", "skipped") else "Failed")
    to_host = host_paths(workflow, run_dir)
    page = Page(
        facts=facts,
        now=NOW,
        training_tasks=training_tasks(facts),
        training_runs=list(runs),
        evaluations=[_evaluation(t, to_host) for t in evaluation_tasks(facts)],
        validations=[_validation(t, facts.name, to_host, run_dir) for t in validation_tasks(facts)],
        registrations=registration_tasks(facts),
        rollouts=rollout_tasks(facts),
        ended_runs=list(ended),
    )
    return render(page)
