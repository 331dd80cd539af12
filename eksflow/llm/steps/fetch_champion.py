r"""Fetch the registered model's current champion: its version, base model and LoRA adapter, for re-evaluation.

    python -m eksflow.llm.steps.fetch_champion --model-name=llama-lora --tracking-uri=sqlite:////fsx/mlflow/mlflow.db \
        --dest-dir=/fsx/runs/<workflow>/champion

The adapter is the version's "adapter" artifact (logged by eksflow.llm.steps.register), downloaded into
<dest_dir>/<name>-v<version>/adapter; an earlier complete download of the same version is reused (versions are
immutable). No champion is bad input (exit 2): there is nothing to check until a rollout promoted one.

Outputs (one file each under --outputs-dir):
    version      the champion's version
    adapter_dir  its downloaded adapter
    base_model   the base model it was trained on (its `base_model` lineage tag)
    metrics      the metrics recorded when it was registered (its `metric.<name>` tags), as JSON
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

from pydantic import BaseModel, Field

from eksflow.llm.steps.common import tracking
from eksflow.runtime.args import Location, StepArgs, StepInputError, run_step

ADAPTER_MARKER = "adapter_config.json"


class Args(StepArgs):
    """Which registered model, and where to put its champion's adapter."""

    model_name: str = Field(pattern=tracking.MODEL_NAME_PATTERN, description="registered model name")
    tracking_uri: Location = Field(description="MLflow tracking and registry URI")
    dest_dir: Path = Field(description="folder the adapter is downloaded into")


class Outputs(BaseModel):
    """Argo output parameters."""

    version: str
    adapter_dir: str
    base_model: str
    metrics: dict[str, float]


def run(args: Args) -> Outputs:
    """Resolve alias `champion` and download its adapter."""
    tracking.require_registry(args.tracking_uri)
    champion = tracking.alias_version(args.tracking_uri, args.model_name, tracking.CHAMPION)
    if champion is None:
        raise StepInputError(
            f"model {args.model_name!r} has no champion at {args.tracking_uri}: nothing to check; run the flagship "
            "pipeline through its rollout first"
        )
    tags = dict(champion.tags or {})
    base_model = tags.get("base_model", "")
    if not base_model:
        raise StepInputError(
            f"{args.model_name} version {champion.version} has no base_model tag; "
            "was it registered by eksflow.llm.steps.register?"
        )
    target = args.dest_dir / f"{args.model_name}-v{champion.version}" / tracking.ADAPTER_ARTIFACT
    if not (target / ADAPTER_MARKER).is_file():
        with tracking.errors(args.tracking_uri, f"downloading the adapter of version {champion.version}"):
            download_adapter(args.tracking_uri, str(champion.run_id), target)
    metrics = tracking.recorded_metrics(tags)
    print(f"champion {args.model_name} version {champion.version} ({base_model}) at {target}", file=sys.stderr)
    return Outputs(version=str(champion.version), adapter_dir=str(target), base_model=base_model, metrics=metrics)


def download_adapter(tracking_uri: str, run_id: str, target: Path) -> None:
    """Download the run's adapter artifact into `target` (a temporary sibling first, then a rename)."""
    import mlflow

    tracking.configure(tracking_uri)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        local = Path(
            mlflow.artifacts.download_artifacts(
                run_id=run_id, artifact_path=tracking.ADAPTER_ARTIFACT, dst_path=str(tmp)
            )
        )
        if not (local / ADAPTER_MARKER).is_file():
            raise StepInputError(f"run {run_id} has no LoRA adapter under artifact {tracking.ADAPTER_ARTIFACT!r}")
        shutil.rmtree(target, ignore_errors=True)
        os.replace(local, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    """Entry point: `python -m eksflow.llm.steps.fetch_champion --name=value ...`."""
    return run_step(Args, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
