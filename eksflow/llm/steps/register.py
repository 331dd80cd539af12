r"""Register a trained LoRA adapter or model in the MLflow model registry (runs only when the evaluation gate passed).

    python -m eksflow.llm.steps.register --adapter-dir=/fsx/wf/adapter --base-model=smollm2-135m-instruct \
        --metrics='{"score": 0.82}' --dataset-digest=sha256:... --workflow-name=wf --merged-dir=/fsx/wf/merged

Logs the adapter folder (artifact path "adapter") to the train step's MLflow run and registers a model version
whose source is that artifact, with lineage tags (`base_model` among them: what serving loads the adapter onto)
and alias `challenger` (aliases only, never stages). vLLM serves the adapter on the base model. An adapter the
pinned vLLM cannot load as a LoRA (DoRA, modules_to_save, a module with no vLLM LoRA layer:
eksflow/llm/steps/common/vllm_lora.py) is also merged into its base and logged as plain safetensors (artifact path
"model"), and the version's source is that model (kind `model`: served by a fleet of its own, as a full
fine-tune is); --merged-dir keeps the merge there, and merges a servable adapter too (its version stays an adapter).
A full fine-tune's folder (train.finetune=full: a whole model, eksflow.llm.steps.common.trained) is logged as
artifact "model" and the version's source is that artifact; vLLM serves it as a model of its own.

Lineage tags on the version: checkpoint_digest, workflow_name and workflow_uid, dataset_digest and dataset_uri,
base_model, git_commit, image, config_hash, eval_set_digest, metric.<name> for every metric, the adapter's kind
(lora.rank, lora.target_modules, lora.use_dora from its adapter_config.json; lora.quantize), and from the
evaluate report (--eval-report) gate.decision, gate.reason and gate.thresholds; `kind`: adapter or model (what the
rollout serves: an adapter on the base, or a Deployment of the model's own). Empty inputs are left out
rather than recorded as "". A report whose gate failed is refused (exit 2): a failed model never registers.

Idempotent: the version carries tag `checkpoint_digest` (sha256 of the adapter's files, or of the model's); a rerun
for the same checkpoint (Argo retry, manual rerun, a client retry whose first response was lost) returns the existing
version and creates no other; lineage tags that version lacks are added, existing ones are never overwritten.

Outputs (one file each under --outputs-dir):
    model_version   the registered version number, e.g. "3"
    model_uri       "models:/<model_name>/<model_version>"
    mlflow_run_id   the run holding the artifacts
    model_version_url  the version's page in the MLflow UI; empty without an http(s) address
    model_kind      "adapter" (LoRA, served on the base) or "model" (a full fine-tune, served as a model)
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, Field, ValidationError

from eksflow.llm.steps.common import tracking, vllm_lora
from eksflow.llm.steps.common.adapter_digest import checkpoint_digest
from eksflow.llm.steps.common.base_model import default_cache_dir, resolve_model
from eksflow.llm.steps.common.trained import ModelKind, model_digest, model_kind
from eksflow.llm.steps.train import Quantize
from eksflow.runtime.args import Location, StepArgs, StepInputError, run_step

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.entities.model_registry import ModelVersion

DIGEST_TAG = "checkpoint_digest"
# The adapter's kind (adapter_tags): load-candidate refuses a version whose tags say vLLM cannot serve it
RANK_TAG = "lora.rank"
TARGET_MODULES_TAG = "lora.target_modules"
USE_DORA_TAG = "lora.use_dora"
QUANTIZE_TAG = "lora.quantize"
KIND_TAG = tracking.KIND_TAG  # adapter or model: how the rollout serves the version


class Args(StepArgs):
    """What the workflow wires in; the registry itself is the pipeline's `mlflow` config section."""

    model_name: str = Field(
        "llama-lora",
        pattern=tracking.MODEL_NAME_PATTERN,
        description="registered model name in MLflow (letters, digits, '.', '_', '-')",
    )
    tracking_uri: Location = Field(description="MLflow tracking and registry URI (http(s):// or sqlite:///)")
    experiment: str = Field("eksflow", description="MLflow experiment of the run when no train run is given")
    adapter_dir: Path = Field(
        description="what the train step wrote: a LoRA adapter folder (peft save_pretrained), or a whole model's "
        "folder (train.finetune=full)"
    )
    base_model: Location = Field(
        description="base model reference the adapter was trained on (see base_model.resolve_model)"
    )
    model_cache_dir: Path = Field(default_factory=default_cache_dir, description="cache for resolved base models")
    metrics: dict[str, float] = Field(description='evaluation metrics as a JSON object, e.g. {"score": 0.8}')
    dataset_digest: str = Field(description="digest of the training data (lineage tag)")
    workflow_name: str = Field(description="Argo workflow name (lineage tag)")
    mlflow_run_id: str = Field("", description="the train step's MLflow run; empty starts a new run")
    merged_dir: Path | None = Field(
        None, description="also merge base + adapter here and log it (artifact 'model'); empty: the adapter only"
    )
    eval_report: Path | None = Field(
        None, description="evaluate's JSON report (tasks.evaluate.outputs.parameters.report): gate lineage tags"
    )
    lora_quantize: Quantize = Field(
        "none", description="train.lora.quantize: how the base was held while the adapter trained (tag lora.quantize)"
    )
    eval_set_digest: str = Field("", description="digest of the eval set the metrics were scored on (lineage tag)")
    workflow_uid: str = Field("", description="Argo workflow uid, {{workflow.uid}} (lineage tag)")
    dataset_uri: str = Field("", description="where the training data came from, e.g. s3://... (lineage tag)")
    config_hash: str = Field("", description="hash of the pipeline config (lineage tag)")
    git_commit: str = Field("", description="commit of the step code (lineage tag); empty: $EKSFLOW_GIT_COMMIT")
    image: str = Field("", description="image reference of the step (lineage tag); empty: $EKSFLOW_IMAGE")
    mlflow_ui_url: str = Field("", description="MLflow UI address for the version link; empty: the tracking URI")


class GateReport(BaseModel):
    """The part of evaluate's eval_report.json that registration records."""

    passed: bool
    reason: str
    thresholds: list[dict[str, object]]
    eval_set_digest: str = ""
    task_metrics: list[str] = []


class Outputs(BaseModel):
    """Argo output parameters."""

    model_version: str
    model_uri: str
    mlflow_run_id: str
    model_version_url: str
    model_kind: ModelKind


def run(args: Args) -> Outputs:
    """Register the adapter or model (or find its existing version) and set alias `challenger` on it."""
    trained = _check_inputs(args)
    gate_report = read_gate_report(args.eval_report) if args.eval_report is not None else None
    kind = served_kind(args.adapter_dir, trained)
    digest = checkpoint_digest(args.adapter_dir) if trained == "adapter" else model_digest(args.adapter_dir)
    with tracking.errors(args.tracking_uri, "registering the model"):
        mlflow_client = tracking.client(args.tracking_uri)
        existing = find_version(mlflow_client, args.model_name, digest)
        if existing is not None:
            print(
                f"model {args.model_name!r} version {existing.version} already holds checkpoint {digest[:12]}; "
                "not registering again",
                file=sys.stderr,
            )
            # Lineage the first registration lacked (e.g. an eval-set digest) is added, never overwritten.
            for tag, value in lineage_tags(args, digest, gate_report, kind).items():
                if tag not in existing.tags:
                    mlflow_client.set_model_version_tag(args.model_name, existing.version, tag, value)
            tracking.set_alias(mlflow_client, args.model_name, tracking.CHALLENGER, existing.version)
            return _outputs(args, existing, kind)
        run_id = _run_id(args)
        if not args.mlflow_run_id:  # the evaluate step logs them to the train run; a new run needs its own copy
            tracking.log_metrics(args.tracking_uri, run_id, args.metrics)
        # what is served: a whole model as trained, an adapter merged into its base, or the adapter itself
        artifact = tracking.MODEL_ARTIFACT if kind == "model" else tracking.ADAPTER_ARTIFACT
        if trained == "model":
            mlflow_client.log_artifacts(run_id, str(args.adapter_dir), tracking.MODEL_ARTIFACT)
        else:
            mlflow_client.log_artifacts(run_id, str(args.adapter_dir), tracking.ADAPTER_ARTIFACT)
            if args.merged_dir is not None or kind == "model":
                _log_merged(args, mlflow_client, run_id)
        tags = lineage_tags(args, digest, gate_report, kind)
        version = create_version(mlflow_client, args.model_name, run_id, tags, artifact)
        tracking.set_alias(mlflow_client, args.model_name, tracking.CHALLENGER, version.version)
    print(
        f"registered {args.model_name!r} version {version.version} ({kind}, alias {tracking.CHALLENGER})",
        file=sys.stderr,
    )
    return _outputs(args, version, kind)


def served_kind(adapter_dir: Path, trained: ModelKind) -> ModelKind:
    """How a version is served: a whole model, or its adapter on the base (TrainSettings.registers, from the folder).

    An adapter the pinned vLLM cannot serve as a LoRA (DoRA, modules_to_save, a module with no vLLM LoRA layer) is
    registered merged into its base, as a model of its own.
    """
    if trained == "model":
        return "model"
    spec = vllm_lora.read_adapter(adapter_dir, "--adapter-dir", weights=False)
    unservable = vllm_lora.unservable_setting(spec.use_dora, spec.target_modules) or spec.modules_to_save
    return "model" if unservable else "adapter"


def _log_merged(args: Args, mlflow_client: MlflowClient, run_id: str) -> None:
    """Merge the adapter into its base and log the merged model as artifact "model".

    Merged in --merged-dir when given, else in a folder beside the adapter for the time it takes.
    """
    base = resolve_model(args.base_model, args.model_cache_dir)
    if args.merged_dir is not None:
        merge_adapter(base, args.adapter_dir, args.merged_dir)
        mlflow_client.log_artifacts(run_id, str(args.merged_dir), tracking.MODEL_ARTIFACT)
        return
    with tempfile.TemporaryDirectory(prefix=".merged.", dir=args.adapter_dir.parent) as scratch:
        merged = Path(scratch) / "model"
        merge_adapter(base, args.adapter_dir, merged)
        mlflow_client.log_artifacts(run_id, str(merged), tracking.MODEL_ARTIFACT)


def find_version(mlflow_client: MlflowClient, model_name: str, digest: str) -> ModelVersion | None:
    """The lowest-numbered version of `model_name` tagged with `digest`, or None."""
    found = mlflow_client.search_model_versions(f"name = '{model_name}' and tags.{DIGEST_TAG} = '{digest}'")
    return min(found, key=lambda v: int(v.version), default=None)


def create_version(
    mlflow_client: MlflowClient,
    model_name: str,
    run_id: str,
    tags: Mapping[str, str],
    artifact: str = tracking.ADAPTER_ARTIFACT,
) -> ModelVersion:
    """Create a version from the run's `artifact` (the adapter, or a full fine-tune's model).

    Duplicates a retried POST may have made are collapsed into the oldest.
    """
    from mlflow.exceptions import MlflowException

    try:
        mlflow_client.create_registered_model(model_name)
    except MlflowException as err:
        if err.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
    source = f"{mlflow_client.get_run(run_id).info.artifact_uri}/{artifact}"
    created = mlflow_client.create_model_version(model_name, source, run_id=run_id, tags=dict(tags))
    # The client retries POSTs on timeouts and 5xx: one call may have created two versions. Keep the oldest.
    twins = mlflow_client.search_model_versions(f"name = '{model_name}' and tags.{DIGEST_TAG} = '{tags[DIGEST_TAG]}'")
    keep = min(twins, key=lambda v: int(v.version), default=created)
    for twin in twins:
        if twin.version != keep.version:
            try:
                mlflow_client.delete_model_version(model_name, twin.version)
            except MlflowException as err:
                # Concurrent registrations of this checkpoint collapse the same twins; one delete wins.
                if err.error_code != "RESOURCE_DOES_NOT_EXIST":
                    raise
    return keep


def read_gate_report(path: Path) -> GateReport:
    """The gate decision from evaluate's report; a failed gate or an unreadable report refuses registration."""
    try:
        report = GateReport.model_validate_json(path.read_text(encoding="utf-8"))
    except (OSError, ValidationError) as err:
        raise StepInputError(
            f"--eval-report={path} is not a readable evaluate report ({type(err).__name__}); pass "
            "tasks.evaluate.outputs.parameters.report"
        ) from err
    if not report.passed:
        raise StepInputError(
            f"--eval-report={path} says the gate failed ({report.reason}); a failed model never registers"
        )
    return report


def lineage_tags(
    args: Args, digest: str, gate_report: GateReport | None = None, kind: ModelKind = "adapter"
) -> dict[str, str]:
    """Tags that trace a version to its data, code, image, workflow, eval set and gate decision, and say its kind.

    `kind` is adapter or model (how it is served); a trained adapter's version, merged or not, also gets the lora.*
    tags of its adapter_config.json.
    """
    values = {
        DIGEST_TAG: digest,
        tracking.DATASET_DIGEST_TAG: args.dataset_digest,
        "dataset_uri": args.dataset_uri,
        "workflow_name": args.workflow_name,
        "workflow_uid": args.workflow_uid,
        "base_model": args.base_model,
        "config_hash": args.config_hash,
        "git_commit": args.git_commit or os.environ.get("EKSFLOW_GIT_COMMIT", ""),
        "image": args.image or os.environ.get("EKSFLOW_IMAGE", ""),
        "eval_set_digest": args.eval_set_digest or (gate_report.eval_set_digest if gate_report else ""),
        **{f"{tracking.METRIC_TAG_PREFIX}{name}": repr(value) for name, value in sorted(args.metrics.items())},
        KIND_TAG: kind,
        # the adapter's kind, merged or not (a folder with adapter_config.json)
        **(
            adapter_tags(args.adapter_dir, args.lora_quantize)
            if model_kind(args.adapter_dir, "--adapter-dir") == "adapter"
            else {}
        ),
    }
    if gate_report is not None:
        values["gate.decision"] = "passed"
        values["gate.reason"] = gate_report.reason[: tracking.MAX_TAG_CHARS]
        described = [f"{t.get('metric')} {t.get('op')} {t.get('value')}" for t in gate_report.thresholds]
        values["gate.thresholds"] = json.dumps(described)[: tracking.MAX_TAG_CHARS]
        values["eval.task_metrics"] = ",".join(gate_report.task_metrics)
    return {tag: value for tag, value in values.items() if value}


def adapter_tags(adapter_dir: Path, quantize: Quantize) -> dict[str, str]:
    """The adapter's kind as tags, read from its adapter_config.json: what a fleet checks before it loads it."""
    spec = vllm_lora.read_adapter(adapter_dir, "--adapter-dir", weights=False)
    return {
        RANK_TAG: str(spec.rank),
        TARGET_MODULES_TAG: ",".join(spec.target_modules),
        USE_DORA_TAG: str(spec.use_dora).lower(),
        QUANTIZE_TAG: quantize,  # the adapter is plain LoRA either way: served on the unquantized base
    }


def merge_adapter(base_dir: Path, adapter_dir: Path, merged_dir: Path) -> None:
    """Fold the adapter into the base weights and save a plain model folder (safetensors + tokenizer)."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype="auto")
    merged = PeftModel.from_pretrained(base, adapter_dir).merge_and_unload()
    # The train step may have saved its own tokenizer (added tokens, chat template); it wins over the base one.
    tokenizer_dir = adapter_dir if (adapter_dir / "tokenizer_config.json").is_file() else base_dir
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    merged_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{merged_dir.name}.", dir=merged_dir.parent))
    try:
        with torch.no_grad():
            merged.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        shutil.rmtree(merged_dir, ignore_errors=True)  # a stale merge of another adapter must not survive
        os.replace(tmp, merged_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _check_inputs(args: Args) -> ModelKind:
    """What --adapter-dir holds, once the inputs are checked."""
    kind = model_kind(args.adapter_dir, "--adapter-dir")
    if not args.metrics:
        raise StepInputError("--metrics is empty; registration needs the evaluation metrics that passed the gate")
    bad = sorted(name for name, value in args.metrics.items() if not math.isfinite(value))
    if bad:
        raise StepInputError(f"--metrics has non-finite values for {bad}; a NaN or inf score must never register")
    return kind


def _run_id(args: Args) -> str:
    from mlflow.exceptions import MlflowException

    if not args.mlflow_run_id:
        return tracking.start_run(
            args.tracking_uri, args.experiment, f"{args.workflow_name}-register", {"workflow_name": args.workflow_name}
        )
    try:
        tracking.client(args.tracking_uri).get_run(args.mlflow_run_id)
    except MlflowException as err:
        if err.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise
        raise StepInputError(
            f"--mlflow-run-id={args.mlflow_run_id!r} does not exist at {args.tracking_uri}; pass the train step's "
            "run id (tasks.train.outputs.parameters.mlflow_run_id) or leave it empty to start a new run"
        ) from err
    return args.mlflow_run_id


def _outputs(args: Args, version: ModelVersion, kind: ModelKind) -> Outputs:
    number = str(version.version)
    return Outputs(
        model_version=number,
        model_uri=f"models:/{args.model_name}/{number}",
        mlflow_run_id=str(version.run_id),
        model_version_url=tracking.model_version_url(args.tracking_uri, args.mlflow_ui_url, args.model_name, number),
        model_kind=kind,
    )


def main(argv: list[str] | None = None) -> int:
    """Entry point: `python -m eksflow.llm.steps.register --name=value ...`."""
    return run_step(Args, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
