"""What this repository's LLM pipelines share: their config base, a model's resources, the exit handler's report.

The flagship (llama_lora), the sweep and the champion check extend `LlmPipelineConfig` and declare only the sections
they use. eksflow's own base (`PipelineConfig`) knows nothing of models, tracking or serving.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import Field

from eksflow import Location, Pipeline, PipelineConfig, Resources, Settings, TaskRef, task
from eksflow.config import StorageSettings
from steps import report

BIG = Resources(cpu_request=2, memory_request="8Gi")  # a model in memory: evaluate, register


def base_model_field() -> Any:
    """The `base_model` field of a pipeline that trains or serves one."""
    return Field("smollm2-135m-instruct", min_length=1, description="demo name, folder or s3:// prefix")


class ModelStorage(StorageSettings):
    """The FSx volume, plus the folder of converted base models every run shares."""

    model_cache: Location = Field("/fsx/models", description="converted/copied base models, shared by runs")


class MlflowSettings(Settings):
    """Tracking server and registry. Locally a sqlite file on the (mapped) FSx volume."""

    tracking_uri: Location = Field(
        "sqlite:////fsx/mlflow/mlflow.db",
        description="http(s)://server or sqlite:///path, without credentials (MLflow reads MLFLOW_TRACKING_TOKEN)",
    )
    experiment: str = Field(
        "", description="MLflow experiment of this pipeline's runs; empty: the pipeline's name (one per pipeline)"
    )
    # The flagship registers this model, the sweep registers into it, the champion check checks it.
    model_name: str = Field(
        "llama-lora",
        pattern=r"^$|^[A-Za-z0-9][A-Za-z0-9._\-]{0,127}$",
        description="registered model name; empty: the pipeline's name",
    )
    ui_url: str = Field(
        "", pattern=r"^$|^https?://", description="MLflow UI address users' browsers reach, for links in outputs"
    )


class LlmPipelineConfig(PipelineConfig):
    """The base of the LLM pipelines: the model cache on FSx, MLflow, and no model hub at run time."""

    env: dict[str, str] = Field(
        {"HF_HUB_OFFLINE": "1"},  # nothing downloads from a model hub at run time
        description="environment of every step container (no secrets: use Secrets)",
    )
    storage: ModelStorage = ModelStorage()
    mlflow: MlflowSettings = MlflowSettings()

    @property
    def experiment(self) -> str:
        """The MLflow experiment of this pipeline's runs: configured, or the pipeline's name."""
        return self.mlflow.experiment or self.name

    @property
    def model_name(self) -> str:
        """The registered model this pipeline's versions go to: configured, or the pipeline's name."""
        return self.mlflow.model_name or self.name


def run_report(p: Pipeline, cfg: LlmPipelineConfig, after: TaskRef | Sequence[TaskRef] = ()) -> TaskRef:
    """The exit handler's report task (every pipeline here has one): the run's HTML page, its MLflow runs ended."""
    return task(
        report,
        after=after,
        workflow_name=p.workflow_name,
        workflow_status=p.workflow_status,
        report_dir=p.run_dir,
        mlflow_ui_url=cfg.mlflow.ui_url,
        tracking_uri=cfg.mlflow.tracking_uri,
    )
