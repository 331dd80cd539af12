r"""One canary step: give the candidate `--percent` of the public model name's traffic, the champion the rest.

    python -m eksflow.llm.steps.shift_traffic --percent=10 --model-name=llama-lora --routes-file=... --state-file=...

The weights change in the routes file on FSx that every LiteLLM proxy pod reads
(eksflow/llm/steps/common/litellm_proxy.py); no request fails during the change, and the next request is routed by the
new weights. Without a live champion the candidate takes all traffic at the first step, and the step waits until the
public name answers from it through the proxy (until then nothing routed the name, so no proxy pod was ready). The
analysis task that follows (eksflow.llm.steps.canary) measures the share the candidate actually got.

Outputs (one file each under --outputs-dir):
    weights   slot id -> weight now in force, as JSON
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from eksflow.llm.steps.common import litellm_proxy, rollout
from eksflow.llm.steps.common.rollout import FleetArgs
from eksflow.runtime.args import StepInputError, run_step

STEP = "shift"


class Args(FleetArgs):
    """The share to give the candidate."""

    percent: float = Field(gt=0, le=100, description="the candidate's share of the public name's requests, percent")
    timeout_s: int = Field(300, ge=1, description="seconds for the proxy to answer from a slot it had no route to")


class Outputs(BaseModel):
    """Argo output parameters."""

    weights: dict[str, float]


@rollout.records_failures(lambda args: f"{STEP}-{args.percent:g}")
def run(args: Args) -> Outputs:
    """Set the slot weights for this step."""
    state = rollout.read_state(args.state_file)
    if state.candidate_slot is None:
        raise StepInputError(f"--state-file={args.state_file} names no candidate: run load-candidate first")
    weights = litellm_proxy.weights_for(args.model_name, state.champion_slot, state.candidate_slot, args.percent)
    routes = rollout.routes(args)
    routes.set_weights(weights)
    if state.champion_slot is None:  # no champion routed the name before: the proxy may become ready only now
        rollout.wait_routed(args, state.candidate_slot, timeout_s=args.timeout_s)
    percent = 100.0 if state.champion_slot is None else args.percent
    rollout.write_state(
        args.state_file, state.model_copy(update={"percent": percent, "stage": f"{STEP}-{args.percent:g}"})
    )
    rollout.log(f"candidate v{state.candidate_version} now takes {percent:g}% ({routes.describe()}): {weights}")
    return Outputs(weights=weights)


def main(argv: list[str] | None = None) -> int:
    """Entry point: `python -m eksflow.llm.steps.shift_traffic --name=value ...`."""
    return run_step(Args, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
