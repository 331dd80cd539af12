r"""vLLM's readiness probe: exit 0 only if the engine answers a real generation (its /health does not prove that).

    python3 -m eksflow.llm.steps.ready --url=http://127.0.0.1:8000 --model=llama-lora-base  # VLLM_API_KEY from the env

Runs inside the vLLM pod (the serve images carry eksflow/llm/steps/), every readinessProbe period: one greedy 2-token
completion of the base model. The local fleet applies the same check (eksflow.llm.steps.common.vllm_client.wait_ready).
"""

from __future__ import annotations

import os
import sys

from pydantic import BaseModel, Field

from eksflow.llm.steps.common import vllm, vllm_client
from eksflow.runtime.args import StepArgs, StepFailedError, run_step


class Args(StepArgs):
    """Which engine and which served model to ask."""

    url: str = Field(pattern=r"^https?://", description="the engine's address inside the pod")
    model: str = Field(min_length=1, description="a served model name (the base model's)")
    timeout_s: float = Field(50, gt=0, description="seconds for the answer (below the probe's timeoutSeconds)")


class Outputs(BaseModel):
    """Nothing: the exit code is the answer."""


def run(args: Args) -> Outputs:
    """One generation; StepFailedError (exit 1: not ready) unless it answers."""
    answer = vllm_client.chat(
        args.url, args.model, vllm.READY_PROMPT, api_key=os.environ.get("VLLM_API_KEY", ""), max_tokens=2,
        timeout_s=args.timeout_s,
    )  # fmt: skip
    if not answer.ok:
        raise StepFailedError(f"not ready: {args.model} at {args.url} answered {answer.status} {answer.error}")
    print(f"ready: {args.model} answered {answer.text!r} in {answer.latency_s:.2f} s", file=sys.stderr)
    return Outputs()


def main(argv: list[str] | None = None) -> int:
    """Entry point: `python -m eksflow.llm.steps.ready --name=value ...` (writes no output files)."""
    return run_step(Args, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
