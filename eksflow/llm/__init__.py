"""eksflow's LLM library (`pip install "eksflow[llm]"`): the LLM steps and the building blocks of an LLM pipeline.

A project imports them beside its own steps and keeps `steps` and `pipelines` (or any names) for itself:

    from eksflow import Pipeline, task
    from eksflow.llm import LlmPipelineConfig, ServingConfig, Tracking, lineage, rollout, finish_rollout, run_report
    from eksflow.llm.steps import evaluate, register, stage_data, train, validate_data

The steps (eksflow.llm.steps, each `python -m eksflow.llm.steps.<name>`) are what the images run; their contract
modules are light (no torch until a step runs). The building blocks, one flat namespace loading each on first use:
    LlmPipelineConfig   the base config of an LLM pipeline: mlflow (tracking, model name), storage.model_cache
    MlflowSettings      its `mlflow` section
    Tracking, Model     the Sections every LLM step takes (the registry and model name; the base model and cache)
    Lineage, lineage    what a registered version records of its run (data digest, code, image, workflow)
    run_report          the exit handler's report task (one HTML page, the run's MLflow runs ended)
    BIG                 the resources of a task holding a model in memory
    base_model_field    the `base_model` field, a served model's folder or reference
    ServingConfig       an LLM pipeline config that also serves: `serving` (vLLM and LiteLLM) and `canary`
    rollout             the rollout stage: the serving fleet, the champion, the canary by weight, promote
    finish_rollout      its exit-handler part: rolls back whatever did not reach promote
The serving engines (vLLM, the LiteLLM proxy) run in virtualenvs of their own, made once per machine from the locks
this package ships (eksflow.llm.engines); a local run makes them beside its first tasks, before the fleet needs them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_PUBLIC = {
    "BIG": "eksflow.llm.pipeline",
    "Lineage": "eksflow.llm.pipeline",
    "LlmPipelineConfig": "eksflow.llm.pipeline",
    "MlflowSettings": "eksflow.llm.pipeline",
    "Model": "eksflow.llm.pipeline",
    "Tracking": "eksflow.llm.pipeline",
    "base_model_field": "eksflow.llm.pipeline",
    "lineage": "eksflow.llm.pipeline",
    "run_report": "eksflow.llm.pipeline",
    "ServingConfig": "eksflow.llm.serving.objects",
    "finish_rollout": "eksflow.llm.serving.rollout",
    "rollout": "eksflow.llm.serving.rollout",
}
__all__ = [
    "BIG",
    "Lineage",
    "LlmPipelineConfig",
    "MlflowSettings",
    "Model",
    "ServingConfig",
    "Tracking",
    "base_model_field",
    "finish_rollout",
    "lineage",
    "rollout",
    "run_report",
]

if TYPE_CHECKING:
    from eksflow.llm.pipeline import (
        BIG,
        Lineage,
        LlmPipelineConfig,
        MlflowSettings,
        Model,
        Tracking,
        base_model_field,
        lineage,
        run_report,
    )
    from eksflow.llm.serving.objects import ServingConfig
    from eksflow.llm.serving.rollout import finish_rollout, rollout


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module 'eksflow.llm' has no attribute {name!r}; public names: {', '.join(__all__)}")
    value = getattr(importlib.import_module(_PUBLIC[name]), name)
    globals()[name] = value
    return value
