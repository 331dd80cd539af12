"""eksflow: one Python file per LLM pipeline, run locally or submitted unchanged to Argo Workflows on EKS.

The public names, in one flat namespace (docs/writing-a-pipeline.md, docs/writing-a-step.md):

Authoring a pipeline (imports hera; never imported by steps):
    Pipeline        the workflow under construction: `with Pipeline(cfg, title=...) as p:`
    task            add a task running a step module; its outputs are attributes of the result
    Section         a typed group of arguments several tasks share (tracking, the base model), written once
    resource        add a task that creates or applies a Kubernetes object (manifest, readiness, failure)
    distributed     add a step that runs across workers (container, KubeRay RayJob or Volcano Job per profile)
    main            the pipeline file's command line: run, render, plan, submit, schedule, config
    PipelineConfig  the base config every pipeline extends with its own sections; `name_field` for its name,
                    `image_field` for its steps' image
    ClusterSettings the `cluster` section a pipeline with distributed steps declares
    config_hash     the lineage hash of a config
    gauges, retry   Prometheus gauges and a retry budget for a task
    Resources       CPU/memory requests of a task (Hera's)
    Ref, TaskRef    a value known when the workflow runs; a task in the DAG
    When            what `when=` takes: a boolean Ref or a condition built from Refs (`score > 0.9`)
    Item            a fan-out's current item (`p.fan_out(body, items)` calls `body(item)`)
    ended           `after=ended(t)`: run once t has finished, whatever its outcome (exit handlers)
    PipelineError, ConfigError

Writing a step (light: what a step image needs):
    Settings, StepArgs, Location, run_step, Progress, StepInputError (exit 2), StepFailedError (exit 1)
    task_metric     declare a function of your module a task metric that `evaluate.task_metrics` may name

Names load on first use, so `from eksflow import StepArgs` in a step never imports hera or the authoring layer.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_PUBLIC = {
    "Pipeline": "eksflow.pipeline",
    "Ref": "eksflow.refs",
    "TaskRef": "eksflow.refs",
    "Item": "eksflow.refs",
    "When": "eksflow.refs",
    "PipelineError": "eksflow.errors",
    "ended": "eksflow.refs",
    "task": "eksflow.templates",
    "resource": "eksflow.resources",
    "Section": "eksflow.sections",
    "gauges": "eksflow.templates",
    "retry": "eksflow.templates",
    "distributed": "eksflow.launchers",
    "main": "eksflow.cli",
    "PipelineConfig": "eksflow.config",
    "ConfigError": "eksflow.errors",
    "config_hash": "eksflow.config",
    "name_field": "eksflow.config",
    "image_field": "eksflow.config",
    "ClusterSettings": "eksflow.cluster",
    "Resources": "hera.workflows",
    "Settings": "eksflow.runtime.args",
    "StepArgs": "eksflow.runtime.args",
    "Location": "eksflow.runtime.args",
    "run_step": "eksflow.runtime.args",
    "StepInputError": "eksflow.runtime.args",
    "StepFailedError": "eksflow.runtime.args",
    "Progress": "eksflow.runtime.outputs",
    "task_metric": "eksflow.runtime.metrics",
}
__all__ = [
    "ClusterSettings",
    "ConfigError",
    "Item",
    "Location",
    "Pipeline",
    "PipelineConfig",
    "PipelineError",
    "Progress",
    "Ref",
    "Resources",
    "Section",
    "Settings",
    "StepArgs",
    "StepFailedError",
    "StepInputError",
    "TaskRef",
    "When",
    "config_hash",
    "distributed",
    "ended",
    "gauges",
    "image_field",
    "main",
    "name_field",
    "resource",
    "retry",
    "run_step",
    "task",
    "task_metric",
]

if TYPE_CHECKING:
    from hera.workflows import Resources

    from eksflow.cli import main
    from eksflow.cluster import ClusterSettings
    from eksflow.config import PipelineConfig, config_hash, image_field, name_field
    from eksflow.errors import ConfigError, PipelineError
    from eksflow.launchers import distributed
    from eksflow.pipeline import Pipeline
    from eksflow.refs import Item, Ref, TaskRef, When, ended
    from eksflow.resources import resource
    from eksflow.runtime.args import Location, Settings, StepArgs, StepFailedError, StepInputError, run_step
    from eksflow.runtime.metrics import task_metric
    from eksflow.runtime.outputs import Progress
    from eksflow.sections import Section
    from eksflow.templates import gauges, retry, task


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module 'eksflow' has no attribute {name!r}; public names: {', '.join(__all__)}")
    value = getattr(importlib.import_module(_PUBLIC[name]), name)
    globals()[name] = value
    return value
