r"""Make sure the fleet serves the champion: its adapter published, its slot routed to it with all the traffic.

    python -m eksflow.llm.steps.serve_champion --model-name=llama-lora --tracking-uri=... --vllm-url=... \
        --proxy-url=... --serving-dir=/fsx/serving/llama-lora/adapters \
        --routes-file=/fsx/serving/llama-lora/routes.json \
        --state-file=/fsx/runs/<wf>/rollout/state.json --base-dir=/fsx/models/m

Idempotent, and the first rollout task. The champion's adapter is published to the fleet's adapter folder (once:
a published adapter stays) and its slot in the routes file names it; every engine of the fleet, a pod just started
included, resolves it by name at its first request. The champion must answer a real generation, and then the
public name through the proxy from the champion's slot, before the task succeeds: a proxy is ready (its Service
sends it clients) only once the routes file routes the public name to one of the pipeline's engines
(eksflow/llm/steps/common/litellm_routes.py), which this task does. Its slot is its `serving.slot` tag (blue for a
version that has none). The state file records the champion this rollout compares against and, at promotion, moves
`champion` from (RO4). A champion trained on another base model cannot share this fleet's engines: the rollout
then goes ahead without a live champion (its recorded scores still gated `evaluate`), the state file still naming it
as the champion the candidate replaces.

A whole-model champion (train.finetune=full) is served by a fleet of its own, which the rollout applied from
publish-champion's outputs: --served-name is the name its engine serves it under, --vllm-url and --fleet that
fleet's Service. Its slot is routed to that engine, which must answer on every replica. An empty --vllm-url (a
full fine-tune's rollout whose champion is an adapter: no base model fleet runs) is a rollout without a live champion.

Outputs (one file each under --outputs-dir):
    champion_version  the version serving as champion, empty when there is none (yet, or on this engine)
    champion_slot     its slot (blue or green), empty when none
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field

from eksflow.llm.steps.common import litellm_proxy, rollout, vllm_lora
from eksflow.llm.steps.common.rollout import FleetArgs, RolloutState
from eksflow.runtime.args import StepInputError, run_step

STEP = "serve-champion"


class Args(FleetArgs):
    """The fleet, plus the base model folder its engine serves (for the adapter's shape check)."""

    base_dir: Path = Field(
        description="the fleet's base model folder (tasks.prepare-fleet.outputs.parameters.model_dir)"
    )
    max_lora_rank: int = Field(16, ge=1, description="the engine's --max-lora-rank (serving.engine.max_lora_rank)")
    served_name: str = Field(
        "",
        pattern=rollout.SERVED_NAME_OR_EMPTY,
        description="a whole-model champion: the name its own fleet's engine serves it under (publish-champion's "
        "served_name); empty: an adapter, published to the fleet's base model engine",
    )
    timeout_s: int = Field(
        300, ge=1, description="seconds for the adapter's first answer, and then for its answer through the proxy"
    )


class Outputs(BaseModel):
    """Argo output parameters."""

    champion_version: str
    champion_slot: str


@rollout.records_failures(STEP)
def run(args: Args) -> Outputs:
    """Load the champion into its slot and route the public name to it."""
    version = rollout.champion_version(args.tracking_uri, args.model_name)
    if not version:
        rollout.log(f"{args.model_name} has no champion yet: the first candidate takes all traffic once it passes")
        rollout.write_state(args.state_file, RolloutState(stage=STEP, vllm_url=args.vllm_url, fleet=args.fleet))
        return Outputs(champion_version="", champion_slot="")
    tags = rollout.version_tags(args.tracking_uri, args.model_name, version)
    slot: litellm_proxy.Slot = "green" if tags.get(rollout.SLOT_TAG) == "green" else "blue"

    def check(adapter: Path) -> None:
        vllm_lora.check_adapter(
            vllm_lora.read_adapter(adapter, "champion"), args.max_lora_rank, args.base_dir, f"champion v{version}"
        )

    try:
        if not args.vllm_url:
            raise StepInputError("no fleet of this rollout serves it (an adapter, and no base model fleet runs)")
        if args.served_name:  # a whole model, on its own fleet
            name = args.served_name
            rollout.route_to_own_fleet(args, version, slot, name, timeout_s=args.timeout_s)
        else:
            name, _ = rollout.publish_to_slot(args, version, slot, check, timeout_s=args.timeout_s)
    except StepInputError as err:  # not this engine's: the old fleet keeps serving it (cluster); compare offline
        rollout.log(f"champion v{version} cannot be served on this fleet ({err}); rollout without a live champion")
        # Still the champion the candidate is compared with and replaces (load-candidate, promote); no slot: not served.
        state = RolloutState(champion_version=version, stage=STEP, vllm_url=args.vllm_url, fleet=args.fleet)
        rollout.write_state(args.state_file, state)
        return Outputs(champion_version="", champion_slot="")
    rollout.routes(args).set_weights(
        litellm_proxy.weights_for(args.model_name, slot, litellm_proxy.other_slot(slot), 0.0)
    )
    rollout.wait_routed(args, slot, timeout_s=args.timeout_s)
    rollout.tag_version(args.tracking_uri, args.model_name, version, {rollout.SLOT_TAG: slot})
    rollout.write_state(
        args.state_file,
        RolloutState(
            champion_version=version,
            champion_slot=slot,
            champion_adapter=name,
            stage=STEP,
            vllm_url=args.vllm_url,
            fleet=args.fleet,
            champion_vllm_url=args.vllm_url,
            champion_fleet=args.fleet,
        ),
    )
    rollout.log(f"champion v{version} serves all traffic from slot {slot} ({name})")
    return Outputs(champion_version=version, champion_slot=slot)


def main(argv: list[str] | None = None) -> int:
    """Entry point: `python -m eksflow.llm.steps.serve_champion --name=value ...`."""
    return run_step(Args, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
