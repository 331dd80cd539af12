r"""Publish a whole-model version to FSx and name the vLLM fleet of its own that serves it (full fine-tunes' rollout).

    python -m eksflow.llm.steps.publish_model --model-name=llama-lora --tracking-uri=... --model-version=4 \
        --models-dir=/fsx/serving/llama-lora/models --pipeline=llama-lora --namespace=argo --port=8000
    python -m eksflow.llm.steps.publish_model ... --alias=champion     # the version `champion` names, if any

A version of kind `model` (train.finetune=full) is served by a Deployment and Service of its own
(eksflow/llm/steps/common/served_models.py): this step downloads its "model" artifact into the models folder once,
and names the fleet, its address and the name its engine serves it under; the rollout then applies that fleet's
objects (when `kind` is model) and load-candidate or serve-champion route a slot to it. A version of kind adapter
(or none, for an alias no version holds) publishes nothing: `kind` says so and every other output is empty, so the
rollout applies no fleet for it.

Outputs (one file each under --outputs-dir):
    version      the version published ("" when the alias names none)
    kind         "model", "adapter" (served on its base model's fleet: nothing published here) or "" (no version)
    own_fleet    true when kind is model: the rollout applies the fleet's objects
    fleet        the Deployment and Service that serve it ("" unless kind is model)
    model_dir    the published folder its engine loads
    vllm_url     the fleet's Service address
    served_name  the name its engine serves it under (its published name)
"""

from __future__ import annotations

import sys
from pathlib import Path

from pydantic import BaseModel, Field, model_validator

from eksflow.llm.steps.common import adapters, served_models, tracking
from eksflow.llm.steps.common.fleet_names import service_url
from eksflow.runtime.args import K8S_NAME, Location, StepArgs, run_step


class Args(StepArgs):
    """Which version (a number, or the one an alias names), where models are published, the names its fleet gets."""

    model_name: str = Field(pattern=tracking.MODEL_NAME_PATTERN, description="registered model name")
    tracking_uri: Location = Field(description="MLflow tracking and registry URI")
    model_version: str = Field("", pattern=r"^([1-9][0-9]*)?$", description="register's model_version")
    alias: str = Field("", pattern=r"^([a-z][a-z0-9_-]{0,62})?$", description="or the version this alias names")
    models_dir: Path = Field(description="the pipeline's model folder on FSx (<fsx>/serving/<model>/models)")
    pipeline: str = Field(pattern=K8S_NAME, max_length=40, description="pipeline name: the fleet's name prefix")
    namespace: str = Field(pattern=K8S_NAME, description="namespace of the fleet's Service")
    port: int = Field(8000, ge=1, le=65535, description="the vLLM Service port")

    @model_validator(mode="after")
    def _one_version(self) -> Args:
        if bool(self.model_version) == bool(self.alias):
            raise ValueError("give either --model-version or --alias")
        return self


class Outputs(BaseModel):
    """Argo output parameters."""

    version: str = ""
    kind: str = ""
    own_fleet: bool = False
    fleet: str = ""
    model_dir: str = ""
    vllm_url: str = ""
    served_name: str = ""


def run(args: Args) -> Outputs:
    """Publish the version if it is a whole model; name its fleet."""
    version = args.model_version
    if args.alias:
        held = tracking.alias_version(args.tracking_uri, args.model_name, args.alias)
        if held is None:
            print(f"{args.model_name} has no version with alias {args.alias!r}: nothing to publish", file=sys.stderr)
            return Outputs()
        version = str(held.version)
    registered = adapters.registered_version(args.tracking_uri, args.model_name, version)
    if not tracking.is_model(registered):
        print(f"{args.model_name} v{version} is an adapter: served on its base model's fleet", file=sys.stderr)
        return Outputs(version=version, kind="adapter")
    with tracking.errors(args.tracking_uri, f"downloading {args.model_name} version {version}"):
        name, folder = served_models.publish(registered, args.models_dir)
    fleet = served_models.model_fleet(args.pipeline, name)
    print(f"{args.model_name} v{version} published as {name} at {folder}, served by fleet {fleet}", file=sys.stderr)
    return Outputs(
        version=version,
        kind="model",
        own_fleet=True,
        fleet=fleet,
        model_dir=str(folder),
        vllm_url=service_url(fleet, args.namespace, args.port),
        served_name=name,
    )


def main(argv: list[str] | None = None) -> int:
    """Entry point: `python -m eksflow.llm.steps.publish_model --name=value ...`."""
    return run_step(Args, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
