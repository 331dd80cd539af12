"""One self-contained HTML page per run, and every MLflow run of the workflow ended: the exit handler's report task.

    with p.on_exit():
        task(report, workflow_name=p.workflow_name, workflow_status=p.workflow_status, report_dir=p.run_dir, ...)

Runs whatever the outcome. It reads the Workflow (spec and node status): locally from the run folder the executor
names in `$EKSFLOW_RUN_DIR` (manifest.yaml, status.json); in a cluster from the Kubernetes API with the pod's
service account (`get` on workflows, see workflow-templates/cluster-prerequisites.yaml). The exit handler runs
while the workflow is still Running: the main DAG's phases are final, the exit handler's own are not.

The page (inline CSS and SVG, no scripts, no external assets) shows the DAG with each task's phase and duration,
every task's outputs, and where their data exists: the training loss and learning-rate curves (the MLflow metric
history of each `mlflow_run_id` output), base vs tuned (vs champion) metrics with the gate's thresholds and
decision and sample answers (evaluate's report), the validation summary with a link to its Data Docs, the
registered version, the rollout tasks, and the canary: each analysis step's traffic share against its weight,
scores, errors and latency as a picture and a table, with where the rollout stopped and why (its
canary-<percent>.json reports). Sections whose task did not run say so.

MLflow: every run the workflow started (the `mlflow_run_id` outputs, and runs tagged `eksflow.workflow=<name>`)
that is still RUNNING ends FINISHED when the workflow succeeded, FAILED otherwise; a resumed workflow's exit
handler runs again, and a run an output names that the earlier try ended gets the new outcome. The page is logged
to the first training run (artifact folder `report`). With no tracking URI both are skipped.

Where the page goes: `$EKSFLOW_RUN_DIR/report.html` in a local run (the folder the CLI prints), else
`<report_dir>/report.html`; a copy in the outputs folder is the Argo output artifact `report` (ARTIFACTS), which
the Argo UI shows.

Outputs (one file each under --outputs-dir):
    report       path of report.html
    ended_runs   MLflow runs this task ended, as a JSON list of run ids
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field

from eksflow.runtime.args import Location, StepArgs

REPORT_FILE = "report.html"
# Output artifacts: name -> file under the outputs folder. The Argo UI shows an unarchived HTML artifact.
ARTIFACTS = {"report": REPORT_FILE}


class Args(StepArgs):
    """Which workflow to report on, where the page goes, and the MLflow server of its runs."""

    workflow_name: str = Field(min_length=1, description="the workflow reported on ({{workflow.name}})")
    workflow_status: str = Field(
        "",
        description="the workflow's outcome ({{workflow.status}} in an exit handler); empty: its status phase",
        pattern=r"^(|Running|Succeeded|Failed|Error)$",
    )
    report_dir: Path = Field(description="folder of report.html when not in a local run (the run's folder)")
    tracking_uri: Location = Field("", description="MLflow URI: loss curves, the logged page, runs ended; empty: none")
    mlflow_ui_url: str = Field("", description="MLflow UI address for run links; empty: the http(s) tracking URI")


class Outputs(BaseModel):
    """Argo output parameters."""

    report: str
    ended_runs: list[str]
