"""The pipeline as Argo objects: the Workflow that `render` prints, `submit` sends and `run` executes.

And the WorkflowTemplate and CronWorkflow made from it (`render --kind`, `schedule`, `make templates`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hera.workflows import DAG, Parameter, Workflow
from hera.workflows import models as m

from eksflow.names import pipeline_labels
from eksflow.pipeline import ENTRYPOINT, EXIT_HANDLER, Pipeline
from eksflow.templates import FSX_VOLUME


def workflow(pipeline: Pipeline) -> Workflow:
    """The Hera Workflow: the main DAG, the exit handler and every template, in the shell every pipeline shares.

    The shell: FSx volume, service account, parameters, cleanup, the exit handler.
    """
    cfg = pipeline.cfg
    dags = [DAG(name=ENTRYPOINT, tasks=pipeline.main.tasks)]
    if pipeline.exit is not None:
        dags.append(DAG(name=EXIT_HANDLER, tasks=pipeline.exit.tasks))
    return Workflow(
        generate_name=f"{cfg.name}-",
        namespace=cfg.namespace,
        entrypoint=ENTRYPOINT,
        on_exit=EXIT_HANDLER if pipeline.exit is not None else None,
        service_account_name=cfg.service_account,
        annotations={
            "workflows.argoproj.io/title": pipeline.title,
            "workflows.argoproj.io/description": pipeline.description,
        },
        labels=pipeline_labels(cfg.name),
        arguments=[Parameter(name=name, value=str(value)) for name, value in pipeline.parameter_values.items()] or None,
        volumes=[
            m.Volume(
                name=FSX_VOLUME,
                persistent_volume_claim=m.PersistentVolumeClaimVolumeSource(claim_name=cfg.storage.fsx_claim),
            )
        ],
        pod_gc=m.PodGC(strategy=cfg.cleanup.pod_gc),
        ttl_strategy=m.TTLStrategy(
            seconds_after_success=cfg.cleanup.keep_succeeded_s, seconds_after_failure=cfg.cleanup.keep_failed_s
        ),
        active_deadline_seconds=cfg.active_deadline_seconds,
        templates=[*dags, *pipeline.templates.values()],
    )


def manifest(pipeline: Pipeline) -> dict[str, Any]:
    """The Workflow as the plain dict that `render` prints, `submit` sends and `run` executes."""
    rendered: dict[str, Any] = workflow(pipeline).to_dict()
    return rendered


KINDS = ("Workflow", "WorkflowTemplate", "CronWorkflow")
CRON_STARTING_DEADLINE_S = 600  # a schedule missed by more than this (controller down) is skipped, not run late


def workflow_template(workflow: Mapping[str, Any]) -> dict[str, Any]:
    """The Workflow as a WorkflowTemplate named after the pipeline (what `argo submit --from` and crons run)."""
    metadata = dict(workflow["metadata"])
    metadata["name"] = metadata.pop("generateName").rstrip("-")
    return {
        "apiVersion": workflow["apiVersion"],
        "kind": "WorkflowTemplate",
        "metadata": metadata,
        "spec": workflow["spec"],
    }


def cron_workflow(
    workflow: Mapping[str, Any], cron: str, timezone: str | None = None, parameters: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """A CronWorkflow running the pipeline's WorkflowTemplate: one run at a time, late runs skipped.

    `parameters` override workflow parameters for scheduled runs (the flagship passes retrain=if-data-changed).
    """
    template = workflow_template(workflow)
    name = template["metadata"]["name"]
    workflow_spec: dict[str, Any] = {"workflowTemplateRef": {"name": name}}
    if parameters:
        workflow_spec["arguments"] = {"parameters": [{"name": k, "value": v} for k, v in parameters.items()]}
    spec: dict[str, Any] = {
        "schedules": [cron],
        "concurrencyPolicy": "Forbid",  # a long training run is never overlapped by the next one
        "startingDeadlineSeconds": CRON_STARTING_DEADLINE_S,
        "successfulJobsHistoryLimit": 3,
        "failedJobsHistoryLimit": 3,
        "workflowMetadata": {"labels": dict(template["metadata"].get("labels", {}))},
        "workflowSpec": workflow_spec,
    }
    if timezone:
        spec["timezone"] = timezone
    metadata = {k: v for k, v in template["metadata"].items() if k in ("name", "namespace", "labels", "annotations")}
    return {"apiVersion": workflow["apiVersion"], "kind": "CronWorkflow", "metadata": metadata, "spec": spec}
