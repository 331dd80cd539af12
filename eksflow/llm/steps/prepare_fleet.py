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

import hashlib
import re
import sys
from pathlib import Path

from pydantic import BaseModel, Field

from eksflow.llm.steps.common.base_model import default_cache_dir, resolve_model
from eksflow.llm.steps.common.chat_template import TemplateSettings
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


def fleet_name(pipeline: str, base_model: str, chat_template_sha256: str = "") -> str:
    """`<pipeline>-vllm-<8 hex>`: stable for a base model, different for another (a new Deployment).

    An engine applies one chat template to every request: a base model asked through train.chat_template's file
    is served by a fleet of its own, named by both.
    """
    served = f"{base_model}\0{chat_template_sha256}" if chat_template_sha256 else base_model
    return f"{pipeline}-vllm-{hashlib.sha256(served.encode()).hexdigest()[:8]}"


def service_url(name: str, namespace: str, port: int) -> str:
    """The in-cluster address of Service `name`."""
    return f"http://{name}.{namespace}.svc.cluster.local:{port}"


def fleet_addresses(pipeline: str, namespace: str, port: int) -> str:
    """A regular expression matching the address of every fleet of `pipeline`: where its proxy may send requests."""
    any_fleet = re.escape(f"{pipeline}-vllm-") + "[0-9a-f]{8}"  # fleet_name's form, for any base model
    return re.escape(service_url("\0", namespace, port)).replace(re.escape("\0"), any_fleet)


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
