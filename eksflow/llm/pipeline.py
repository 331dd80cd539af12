"""What this repository's LLM pipelines share: their config base, the sections their tasks take, the report.

The flagship (llama_lora), the sweep and the champion check extend `LlmPipelineConfig` and declare only the sections
they use. eksflow's own base (`PipelineConfig`) knows nothing of models, tracking or serving. The shared Sections
(eksflow.sections) are each pipeline's wires to MLflow (`cfg.tracking`), to the base model (`Model`) and to the
run's lineage (`lineage`): a task takes the fields its step declares.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any
from urllib.parse import urlsplit

from pydantic import ConfigDict, Field, ValidationInfo, field_validator

from eksflow import Location, Pipeline, PipelineConfig, Ref, Resources, Section, Settings, TaskRef, config_hash, task
from eksflow.config import StorageSettings
from eksflow.llm.steps import report
from eksflow.llm.tracking_server import server_problem, uri_problem
from eksflow.runtime.args import REPORTING

BIG = Resources(cpu_request=1, memory_request="8Gi")  # a model in memory on one thread: evaluate, register


def base_model_field() -> Any:
    """The `base_model` field of a pipeline that trains or serves one."""
    return Field("smollm2-135m-instruct", min_length=1, description="demo name, folder or s3:// prefix")


class ModelStorage(StorageSettings):
    """The FSx volume, plus the folder of converted base models every run shares."""

    model_cache: Location = Field(
        "/fsx/models",
        description="base models (converted or copied), tokenized data and base-model answers, shared by runs",
    )


class MlflowSettings(Settings):
    """Tracking server and registry. Locally a sqlite file on the (mapped) FSx volume.

    Where a run reports, not what it computes: `run --resume` takes a new tracking_uri or ui_url (REPORTING).
    """

    tracking_uri: Annotated[Location, REPORTING] = Field(
        "sqlite:////fsx/mlflow/mlflow.db",
        description="http(s)://server[:port][/path], sqlite:////path.db, file:///folder, postgresql://host/db or "
        "databricks, without credentials (MLflow reads MLFLOW_TRACKING_TOKEN)",
    )
    experiment: str = Field(
        "", description="MLflow experiment of this pipeline's runs; empty: the pipeline's name (one per pipeline)"
    )
    model_name: str = Field(
        "",
        pattern=r"^$|^[A-Za-z0-9][A-Za-z0-9._\-]{0,127}$",
        description="registered model name; empty: the pipeline's name",
    )
    ui_url: Annotated[str, REPORTING] = Field(
        "", pattern=r"^$|^https?://", description="MLflow UI address users' browsers reach, for links in outputs"
    )

    @field_validator("tracking_uri")
    @classmethod
    def _a_tracking_uri(cls, uri: str) -> str:
        if problem := uri_problem(uri):
            raise ValueError(problem)
        return uri

    def local_problems(self) -> list[str]:
        """`tracking_uri: problem` when its server does not answer (asked by `run` before any task starts).

        A database or file store is made by the first step that opens it; an http(s) server must be up now, or
        training would run untracked and evaluate fail after it.
        """
        if urlsplit(self.tracking_uri).scheme.lower() not in ("http", "https"):
            return []
        return [f"tracking_uri: {problem}"] if (problem := server_problem(self.tracking_uri)) else []


@dataclass(frozen=True)
class Tracking(Section):
    """MLflow: where steps log runs, find the champion and register versions, and the link users follow."""

    tracking_uri: str
    mlflow_ui_url: str
    model_name: str
    experiment: str


@dataclass(frozen=True)
class Model(Section):
    """The base model a step loads (a name, a folder or an s3:// prefix; often a workflow parameter) and its cache."""

    base_model: Ref | str
    model_cache_dir: str


@dataclass(frozen=True)
class Lineage(Section):
    """What a registered version records of the run that made it."""

    workflow_name: Ref
    workflow_uid: Ref
    dataset_uri: Ref | str
    config_hash: str


def lineage(p: Pipeline, cfg: PipelineConfig, dataset_uri: Ref | str) -> Lineage:
    """This run's lineage: the workflow, the data it was given and the config's hash."""
    return Lineage(p.workflow_name, p.workflow_uid, dataset_uri, config_hash(cfg))


class LlmPipelineConfig(PipelineConfig):
    """The base of the LLM pipelines: the model cache on FSx, MLflow, and no model hub at run time."""

    env: dict[str, str] = Field(
        {"HF_HUB_OFFLINE": "1"},  # nothing downloads from a model hub at run time
        description="environment of every step container (no secrets: use Secrets)",
    )
    storage: ModelStorage = ModelStorage()
    mlflow: MlflowSettings = MlflowSettings()

    # A declared default is validated as a given value is: `mlflow: MlflowSettings = MlflowSettings(ui_url=...)`,
    # redeclared by a pipeline, still gets its model named (_model_named).
    model_config = ConfigDict(validate_default=True)

    # Declared by the pipelines that train or serve (base_model_field): one rule for their base model and data.source.
    @field_validator("base_model", check_fields=False)
    @classmethod
    def _a_model_location(cls, reference: str) -> str:
        from eksflow.llm.steps.common.base_model import DEMO_MODEL  # light: no model library until one loads
        from eksflow.llm.steps.common.storage import location_problem  # light: no cloud library

        accepted = f"{DEMO_MODEL} (the demo), a model folder, file:///absolute/path or s3://bucket/prefix"
        if problem := location_problem(reference, accepted):
            raise ValueError(problem)
        return reference

    # Declared by the pipelines that train and evaluate, train before evaluate: one rule for what evaluate may read.
    @field_validator("evaluate", check_fields=False)
    @classmethod
    def _metrics_of_the_method(cls, evaluate: Any, info: ValidationInfo) -> Any:
        train = info.data.get("train")
        if train is not None:  # else refused itself, saying why
            evaluate.require_method(train.method)
        return evaluate

    @field_validator("mlflow")
    @classmethod
    def _model_named(cls, mlflow: MlflowSettings, info: ValidationInfo) -> MlflowSettings:
        # Named in the config itself, not only when read: every task, `config` and the lineage hash see the model
        # the versions go to, and a config leaving it to the pipeline's name hashes as one naming it does.
        name = info.data.get("name")
        if mlflow.model_name or name is None:  # no name: refused itself, saying why
            return mlflow
        return mlflow.model_copy(update={"model_name": name})

    @property
    def experiment(self) -> str:
        """The MLflow experiment of this pipeline's runs: configured, or the pipeline's name."""
        return self.mlflow.experiment or self.name

    @property
    def model_name(self) -> str:
        """The registered model this pipeline's versions go to: configured, or the pipeline's name (_model_named)."""
        return self.mlflow.model_name

    @property
    def tracking(self) -> Tracking:
        """The MLflow section every tracking task takes."""
        return Tracking(self.mlflow.tracking_uri, self.mlflow.ui_url, self.model_name, self.experiment)

    def model(self, base_model: Ref | str) -> Model:
        """The base-model section: `base_model` (a workflow parameter, a task output or a literal) and the cache."""
        return Model(base_model, self.storage.model_cache)


def run_report(p: Pipeline, cfg: LlmPipelineConfig, after: TaskRef | Sequence[TaskRef] = ()) -> TaskRef:
    """The exit handler's report task (every pipeline here has one): the run's HTML page, its MLflow runs ended."""
    return task(
        report,
        cfg.tracking,
        after=after,
        workflow_name=p.workflow_name,
        workflow_status=p.workflow_status,
        report_dir=p.run_dir,
    )
