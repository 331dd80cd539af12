"""The pipeline's typed config: defaults live here, a YAML file and `--set key=value` only override.

Each step section is that step's own Settings model (steps/<name>.py), so the pipeline and the step validate the
same fields with the same rules. Unknown keys are errors, and every error is reported at once.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, field_validator

from eksflow.profiles import PROFILES
from eksflow.runtime.args import Settings
from steps.champion import Retrain
from steps.deploy import DeploySettings
from steps.evaluate import EvaluateSettings
from steps.stage_data import StageSettings
from steps.train import TrainSettings
from steps.validate_data import ValidateSettings

K8S_NAME = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"


class ConfigError(Exception):
    """Config that cannot run; each line names the field and the fix."""


class Images(Settings):
    """Container images, built from images/*.Dockerfile and pinned by tag or digest (never :latest)."""

    steps: str = Field("ghcr.io/eksflow/steps:0.1.0", description="CPU image: stage, validate, evaluate, register")
    train: str = Field("ghcr.io/eksflow/train-gpu:0.1.0", description="training image (CUDA, NCCL, EFA)")
    train_neuron: str = Field("ghcr.io/eksflow/train-neuron:0.1.0", description="Trainium image (Neuron SDK)")

    @field_validator("steps", "train", "train_neuron")
    @classmethod
    def _pinned(cls, image: str) -> str:
        name = image.rsplit("/", 1)[-1]
        if "@sha256:" not in image and (":" not in name or name.endswith(":latest")):
            raise ValueError(f"image {image!r} is not pinned; use repo:tag (not latest) or repo@sha256:<digest>")
        return image


class StorageSettings(Settings):
    """Shared storage: the FSx for Lustre claim every step mounts."""

    fsx_claim: str = Field("fsx-claim", pattern=K8S_NAME, description="PersistentVolumeClaim of the FSx volume")
    fsx_mount: str = Field("/fsx", pattern=r"^/[\w\-/]*$")
    model_cache: str = Field("/fsx/models", description="converted/copied base models, shared by runs")


class MlflowSettings(Settings):
    """Tracking server and registry. Locally a sqlite file on the (mapped) FSx volume."""

    tracking_uri: str = Field("sqlite:////fsx/mlflow/mlflow.db", description="http(s)://server or sqlite:///path")
    experiment: str = Field("eksflow", min_length=1)
    model_name: str = Field("llama-lora", pattern=r"^[\w.\-]+$", description="registered model name")
    ui_url: str = Field(
        "", pattern=r"^$|^https?://", description="MLflow UI address users' browsers reach, for links in outputs"
    )


class ClusterSettings(Settings):
    """Where the training job runs on EKS: the node type (its accelerator profile) and how it is gang-scheduled."""

    instance_type: str = Field("m6i.4xlarge", description="EC2 instance type of the training nodes (profiles.py)")
    nodes: int = Field(1, ge=1, le=64, description="training nodes; the job is admitted only when all fit at once")
    launcher: Literal["rayjob", "mpijob"] = Field(
        "rayjob",
        description="GPU (and CPU) training job: rayjob (KubeRay RayJob, Ray Train; CPU: one plain pod) or mpijob "
        "(MPI Operator MPIJob, mpirun over worker pods); Trainium always runs torchrun in a Volcano Job",
    )
    scheduler: Literal["kueue", "volcano"] = Field("kueue", description="gang admission of the training job")
    queue: str = Field("eksflow", pattern=K8S_NAME, description="Kueue LocalQueue or Volcano Queue name")
    spot: bool = Field(False, description="Spot capacity for training (requires checkpointing)")
    zone: str = Field("", pattern=r"^([a-z]{2}-[a-z]+-\d[a-z])?$", description="AZ of EFA nodes, e.g. us-west-2a")
    rayjob_backoff_limit: int = Field(
        1, ge=0, le=10, description="the training job's own retries: RayJob resubmissions, MPIJob launcher restarts"
    )
    retry_budget: int = Field(12, ge=1, description="most training attempts: Argo x RayJob x Ray Train, multiplied")
    ttl_seconds_after_finished: int = Field(600, ge=0, description="how long a finished RayJob's cluster is kept")
    expected_hours: float = Field(1.0, gt=0, description="expected training time, for `plan`'s cost per run")
    model_params_b: float = Field(0.0, ge=0, description="base model size in billions; 0: read from its name")

    @field_validator("instance_type")
    @classmethod
    def _known(cls, instance_type: str) -> str:
        if instance_type not in PROFILES:
            raise ValueError(f"unknown instance type {instance_type!r}; known: {', '.join(sorted(PROFILES))}")
        return instance_type


class PipelineConfig(Settings):
    """Everything a pipeline run needs; validated at render/run time and again inside each step."""

    name: str = Field("llama-lora", pattern=K8S_NAME, max_length=50, description="workflow name prefix")
    namespace: str = Field("argo", pattern=K8S_NAME)
    service_account: str = Field("eksflow-pipeline", pattern=K8S_NAME)
    base_model: str = Field("smollm2-135m-instruct", min_length=1, description="demo name, folder or s3:// prefix")
    retrain: Retrain = Field(
        "always",
        description="always, or if-data-changed: skip training when the champion was trained on the same data "
        "(the CronWorkflow always passes if-data-changed)",
    )
    images: Images = Images()
    storage: StorageSettings = StorageSettings()
    mlflow: MlflowSettings = MlflowSettings()
    data: StageSettings = StageSettings()
    validation: ValidateSettings = ValidateSettings()
    train: TrainSettings = TrainSettings()
    evaluate: EvaluateSettings = EvaluateSettings()
    deploy: DeploySettings = DeploySettings()
    cluster: ClusterSettings = ClusterSettings()


def load_config(path: Path | None = None, overrides: Iterable[str] = ()) -> PipelineConfig:
    """Defaults, then the YAML file, then each `dotted.key=value` override (values parsed as YAML scalars)."""
    raw: dict[str, Any] = {}
    if path is not None:
        if not path.is_file():
            raise ConfigError(f"--config {path}: file not found")
        loaded = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"--config {path}: expected a mapping of sections, got {type(loaded).__name__}")
        raw = loaded
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set {item!r}: expected dotted.key=value, e.g. --set train.max_steps=20")
        _assign(raw, key.split("."), yaml.safe_load(value) if value else "")
    try:
        return PipelineConfig.model_validate(raw)
    except ValidationError as err:
        raise ConfigError("\n".join(explain(err))) from err


def explain(err: ValidationError) -> list[str]:
    """One line per problem: `train.learning_rate: Input should be greater than 0 (got -1); fix: ...`."""
    lines = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"])
        if e["type"] == "extra_forbidden":
            parent = ".".join(str(p) for p in e["loc"][:-1])
            lines.append(
                f"{key}: unknown key; valid keys{' in ' + parent if parent else ''}: "
                f"{', '.join(_valid_keys(e['loc'][:-1]))}"
            )
        else:
            lines.append(
                f"{key}: {e['msg']} (got {e.get('input')!r}); fix it with --set {key}=<value> or in the --config file"
            )
    return lines


def _valid_keys(loc: tuple[int | str, ...]) -> list[str]:
    model: Any = PipelineConfig
    for part in loc:
        field = model.model_fields.get(part) if isinstance(part, str) else None
        if field is None or not isinstance(field.annotation, type):
            return []
        model = field.annotation
    return sorted(model.model_fields)


def _assign(tree: dict[str, Any], path: list[str], value: object) -> None:
    for part in path[:-1]:
        child = tree.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"--set {'.'.join(path)}: {part!r} is a value, not a section")
        tree = child
    tree[path[-1]] = value


def dump(config: Mapping[str, Any] | PipelineConfig) -> str:
    """The config as YAML (for `config` listings and docs)."""
    data = config.model_dump(mode="json") if isinstance(config, PipelineConfig) else dict(config)
    return yaml.safe_dump(data, sort_keys=False)


def config_hash(config: PipelineConfig) -> str:
    """`sha256:<hex>` of the validated config: the lineage tag that says which settings produced a model."""
    return "sha256:" + hashlib.sha256(config.model_dump_json().encode()).hexdigest()
