"""The MLflow side of the report: training curves to plot, the workflow's runs to end, the page to log.

mlflow is imported inside the functions (the contract and the renderers stay light). Reads are best effort: a
server that cannot answer turns into a note on the page. Ending runs is not: a run left RUNNING is the bug this
task exists to prevent, so a failure there fails the task (after the page is written), and Argo retries it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eksflow.llm.steps.common import tracking

CURVES = ("loss", "learning_rate", "tokens_per_s")  # what the train step logs every log_every steps
REPORT_ARTIFACT = "report"  # artifact folder of the page in the MLflow run
ACTIVE = ("RUNNING", "SCHEDULED")  # statuses of a run nobody ended
ENDED_TAG = "eksflow.ended_as"  # on each run this task ends: the status it gave it (FINISHED or FAILED)
# Tags naming a run's workflow: the train step's, and register's when it starts a run of its own.
WORKFLOW_TAGS = (tracking.WORKFLOW_TAG, "workflow_name")
EXPERIMENTS_PER_SEARCH = 50


@dataclass(frozen=True)
class TrainingRun:
    """A training run as plotted: its metric histories as (step, value) pairs."""

    run_id: str
    name: str
    status: str
    url: str
    params: Mapping[str, str] = field(default_factory=dict)
    history: Mapping[str, tuple[tuple[float, float], ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class EndedRun:
    """A run this task ended: its name and the status it now has."""

    run_id: str
    name: str
    status: str


def read_training_runs(tracking_uri: str, ui_url: str, run_ids: Sequence[str]) -> tuple[list[TrainingRun], list[str]]:
    """The training runs with their curves, and one line per run that could not be read."""
    from mlflow.exceptions import MlflowException
    from requests import RequestException

    runs: list[TrainingRun] = []
    problems: list[str] = []
    client = tracking.client(tracking_uri)
    for run_id in run_ids:
        try:
            run = client.get_run(run_id)
            history = {key: latest_per_step(client.get_metric_history(run_id, key)) for key in CURVES}
        except (MlflowException, RequestException, OSError) as err:
            problems.append(f"MLflow run {run_id} at {tracking_uri} could not be read: {_first_line(err)}")
            continue
        runs.append(
            TrainingRun(
                run_id=run_id,
                name=str(run.info.run_name or ""),
                status=str(run.info.status),
                url=tracking.run_url(tracking_uri, ui_url, run_id),
                params={str(k): str(v) for k, v in run.data.params.items()},
                history={k: v for k, v in history.items() if v},
            )
        )
    return runs, problems


def latest_per_step(metrics: Sequence[Any]) -> tuple[tuple[float, float], ...]:
    """(step, value) in step order, each step once: the value logged last.

    A retry resumes from its last checkpoint and logs again the steps done after it (a node lost, a trainer killed):
    the resumed values are what the adapter carries on from, and MLflow keeps both.
    """
    latest: dict[float, float] = {}
    for metric in sorted(metrics, key=lambda m: m.timestamp):  # MLflow's timestamps: milliseconds
        latest[float(metric.step)] = float(metric.value)
    return tuple(sorted(latest.items()))


def workflow_run_ids(tracking_uri: str, workflow_name: str) -> list[str]:
    """Runs tagged with the workflow's name that are still active, in every experiment.

    A failed train step wrote no `mlflow_run_id` output, yet started its run: the tag finds it.
    """
    from mlflow.entities import ViewType

    with tracking.errors(tracking_uri, f"searching the runs of workflow {workflow_name!r}"):
        client = tracking.client(tracking_uri)
        experiment_ids: list[str] = []
        token: str | None = None
        while True:
            page = client.search_experiments(view_type=ViewType.ACTIVE_ONLY, max_results=1000, page_token=token)
            experiment_ids += [str(e.experiment_id) for e in page]
            token = page.token
            if not token:
                break
        quoted = workflow_name.replace("\\", "\\\\").replace("'", "\\'")
        found: list[str] = []
        for start in range(0, len(experiment_ids), EXPERIMENTS_PER_SEARCH):
            batch = experiment_ids[start : start + EXPERIMENTS_PER_SEARCH]
            for tag in WORKFLOW_TAGS:
                runs = client.search_runs(batch, filter_string=f"tags.`{tag}` = '{quoted}'", max_results=1000)
                found += [str(r.info.run_id) for r in runs if r.info.status in ACTIVE]
    return list(dict.fromkeys(found))


def end_runs(
    tracking_uri: str, run_ids: Sequence[str], succeeded: bool, *, kept: Collection[str] = ()
) -> list[EndedRun]:
    """End every still-active run of `run_ids`: FINISHED when the workflow succeeded, FAILED otherwise.

    Runs already ended keep their status (a step may have ended its own run, or a retry of this task did), but
    for those of `kept` (runs the workflow's succeeded tasks name) that an earlier try of this task ended with
    the other status: a resumed workflow's outcome replaces the failed try's, as its page does.
    """
    from mlflow.exceptions import MlflowException

    status = "FINISHED" if succeeded else "FAILED"
    ended: list[EndedRun] = []
    with tracking.errors(tracking_uri, f"ending runs {', '.join(run_ids)} as {status}"):
        client = tracking.client(tracking_uri)
        for run_id in run_ids:
            try:
                run = client.get_run(run_id)
            except MlflowException as err:
                if err.error_code == "RESOURCE_DOES_NOT_EXIST":
                    continue  # an id from another server (a step pointed elsewhere): nothing here to end
                raise
            ended_here = run.data.tags.get(ENDED_TAG) == run.info.status  # by an earlier try, and nobody since
            if run.info.status in ACTIVE or (run_id in kept and ended_here and run.info.status != status):
                client.set_terminated(run_id, status=status)
                client.set_tag(run_id, ENDED_TAG, status)
                ended.append(EndedRun(run_id, str(run.info.run_name or ""), status))
    return ended


def log_page(tracking_uri: str, run_id: str, page: Path) -> bool:
    """Log the page into the run's artifact folder `report`; False (with a warning) when MLflow failed."""
    return tracking.log_files(tracking_uri, run_id, [page], REPORT_ARTIFACT)


def _first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0][:300]
