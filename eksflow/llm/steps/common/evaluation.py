"""What `evaluate` recorded for a registered version, read back by the rollout: its report in the version's run."""

from __future__ import annotations

import json
from dataclasses import dataclass

from eksflow.llm.steps.common import tracking
from eksflow.runtime.args import StepInputError

REPORT_FILE = "eval_report.json"
REPORT_ARTIFACT = "eval"  # artifact folder of the reports in the MLflow run


@dataclass(frozen=True)
class Evaluation:
    """What `evaluate` recorded for a registered version: its task metrics, per-row scores and answer cap."""

    task_metrics: list[str]  # as evaluate.task_metrics named them: the keys of each row's scores
    rows: list[dict[str, object]]  # in order: prompt, reference, answer and one score per task metric
    max_new_tokens: int = 0  # new tokens each answer could take (0: a report that does not record it)


def evaluated_rows(tracking_uri: str, model_name: str, version: str) -> list[dict[str, object]]:
    """The held-out rows `evaluate` scored for a registered version, in order (see `evaluation`)."""
    return evaluation(tracking_uri, model_name, version).rows


def evaluation(tracking_uri: str, model_name: str, version: str) -> Evaluation:
    """The task metrics and per-row scores of a registered version's evaluation (its report in the version's run).

    Raises StepInputError when the version's run has no report: what is served cannot be compared with what was
    evaluated without it.
    """
    import mlflow
    from mlflow.exceptions import MlflowException

    with tracking.errors(tracking_uri, f"reading the evaluation report of {model_name} v{version}"):
        run_id = tracking.client(tracking_uri).get_model_version(model_name, version).run_id
        try:
            text = mlflow.artifacts.load_text(f"runs:/{run_id}/{REPORT_ARTIFACT}/{REPORT_FILE}")
        except (MlflowException, OSError) as err:
            raise StepInputError(
                f"--model-name={model_name}: version {version} has no {REPORT_ARTIFACT}/{REPORT_FILE} in run "
                f"{run_id}; served == evaluated cannot be checked without evaluate's per-row scores"
            ) from err
    report = json.loads(text)
    rows, listed = report.get("rows") or [], report.get("task_metrics") or []
    cap = report.get("max_new_tokens")
    return Evaluation(
        [m for m in listed if isinstance(m, str)],
        [r for r in rows if isinstance(r, dict)],
        cap if isinstance(cap, int) and cap > 0 else 0,
    )
