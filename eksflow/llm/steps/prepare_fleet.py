r"""Name the serving fleet of a base model and make the model folder vLLM loads (first task of the serving path).

    python -m eksflow.llm.steps.prepare_fleet --base-model=smollm2-135m-instruct --model-cache-dir=/fsx/models \
        --pipeline=llama-lora --namespace=argo --port=8000

The fleet is one vLLM Deployment and Service per base model, named `<pipeline>-vllm-<8 hex of the base model
reference>`: a candidate on the champion's base model joins the champion's engine as a second adapter; a
candidate on a new base model gets a new fleet (a new Deployment), and the champion's keeps serving until
promotion. A base model given a chat template (train.chat_template) is a fleet of its own, started on the model
folder that holds the template (eksflow.llm.steps.common.chat_template). The base model is resolved here (the demo
GGUF converted once, an s3:// prefix copied once into the model cache on FSx), so the engine starts on a plain
safetensors folder.

Outputs (one file each under --outputs-dir):
    model_dir   the base model folder the engine loads (--model)
    fleet       the Kubernetes name of the fleet's Deployment and Service
    vllm_url    the fleet's Service address, http://<fleet>.<namespace>.svc.cluster.local:<port>
"""

from __future__ import annotations

import sys
from pathlib import Path

from pydantic import BaseModel, Field

from eksflow.llm.steps.common.base_model import default_cache_dir, resolve_model
from eksflow.llm.steps.common.chat_template import TemplateSettings
from eksflow.llm.steps.common.fleet_names import fleet_name, service_url
from eksflow.runtime.args import K8S_NAME, Location, StepArgs, run_step


class Args(TemplateSettings, StepArgs):
    """Which base model and chat template (train's), and the names the fleet's objects get."""

    base_model: Location = Field(
        min_length=1, description="demo name, model folder or s3:// prefix (eksflow.llm.steps.common.base_model)"
    )
    model_cache_dir: Path = Field(default_factory=default_cache_dir, description="where converted base models live")
    pipeline: str = Field(pattern=K8S_NAME, max_length=40, description="pipeline name: the fleet's name prefix")
    namespace: str = Field(pattern=K8S_NAME, description="namespace of the fleet's Service")
    port: int = Field(8000, ge=1, le=65535, description="the vLLM Service port")
    serving_dir: Path = Field(
        description="the fleet's adapter folder on FSx, made here: vLLM's resolver needs it when the engine starts"
    )


class Outputs(BaseModel):
    """Argo output parameters."""

    model_dir: str
    fleet: str
    vllm_url: str


def run(args: Args) -> Outputs:
    """Resolve the base model folder and name the fleet."""
    model_dir = args.templated(resolve_model(args.base_model, args.model_cache_dir), args.model_cache_dir)
    fleet = fleet_name(args.pipeline, args.base_model, args.template_digest())
    args.serving_dir.mkdir(parents=True, exist_ok=True)
    print(f"fleet {fleet} serves {args.base_model} from {model_dir}", file=sys.stderr)
    return Outputs(model_dir=str(model_dir), fleet=fleet, vllm_url=service_url(fleet, args.namespace, args.port))


def main(argv: list[str] | None = None) -> int:
    """Entry point: `python -m eksflow.llm.steps.prepare_fleet --name=value ...`."""
    return run_step(Args, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
