r"""Put the `previous` version back as champion and route the public model name to it (the manual way back).

    python -m eksflow.llm.steps.rollback --model-name=llama-lora --tracking-uri=... --vllm-url=... --proxy-url=... \
        --serving-dir=/fsx/serving/llama-lora --state-file=/fsx/serving/llama-lora/rollback-state.json \
        --base-dir=/fsx/models/m          # in the cluster, next to the fleet (e.g. `argo submit` of this step)
    make rollback                         # here: the local fleet lives only as long as a run, so only the aliases

With a fleet (--vllm-url given): `previous`'s adapter is published (it usually still is) and assigned to the slot
the champion does not hold, and must answer a real generation on every ready replica of --fleet (the fleet's
Service, whose endpoints list them; without it, on the one --vllm-url reaches); then the public name's traffic
moves to it, and it must answer its probe set through the proxy (else the traffic goes back and nothing else
changes: exit 1). The bad champion's slot keeps weight 0; the restored version is tagged rollout.phase=Healthy.
Then the aliases swap: `champion` -> the previous version, `previous` -> the version rolled back, which is tagged
rollout.phase=RolledBack. Without a fleet only the aliases move (the next run serves the new champion). Exit 2
when there is no `previous` to go back to.

Outputs (one file each under --outputs-dir):
    champion_version  the version now champion
    previous_version  the version rolled back
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field

from eksflow.llm.steps.common import litellm_proxy, rollout, tracking, vllm_lora
from eksflow.llm.steps.common.rollout import FleetArgs
from eksflow.runtime.args import StepFailedError, StepInputError, run_step


class Args(FleetArgs):
    """The registry, and the fleet when there is one to re-route (empty --vllm-url: aliases only)."""

    vllm_url: str = Field("", pattern=r"^$|^https?://", description="the vLLM Service; empty: move the aliases only")
    proxy_url: str = Field("", pattern=r"^$|^https?://", description="the LiteLLM proxy Service")
    serving_dir: Path = Field(
        Path("/fsx/serving"), description="the fleet's adapter folder (<fsx>/serving/<model>/adapters in a pipeline)"
    )
    routes_file: Path = Field(
        Path("/fsx/serving/routes.json"), description="the proxy's routes file (<fsx>/serving/<model>/routes.json)"
    )
    state_file: Path = Field(Path("/fsx/serving/rollback-state.json"), description="not used by a rollback")
    base_dir: Path = Field(Path(), description="the fleet's base model folder (for the adapter check)")
    max_lora_rank: int = Field(16, ge=1, description="the engine's --max-lora-rank")
    timeout_s: int = Field(300, ge=1, description="seconds for the restored version's first answer")


class Outputs(BaseModel):
    """Argo output parameters."""

    champion_version: str
    previous_version: str


def run(args: Args) -> Outputs:
    """Serve `previous` (with a fleet), then swap the aliases."""
    tracking.require_registry(args.tracking_uri)
    previous = tracking.alias_version(args.tracking_uri, args.model_name, tracking.PREVIOUS)
    if previous is None:
        raise StepInputError(
            f"--model-name={args.model_name}: no version holds alias `previous` at {args.tracking_uri}; nothing to "
            "roll back to (the first promotion sets it)"
        )
    restored = str(previous.version)
    bad = rollout.champion_version(args.tracking_uri, args.model_name)
    if args.vllm_url:
        _reroute(args, restored, bad)
    else:
        rollout.log("no --vllm-url: moving the aliases only (a local fleet lives only as long as its run)")
    with tracking.errors(args.tracking_uri, f"moving {args.model_name}'s aliases back to v{restored}"):
        client = tracking.client(args.tracking_uri)
        tracking.set_alias(client, args.model_name, tracking.CHAMPION, restored)
        if bad and bad != restored:
            tracking.set_alias(client, args.model_name, tracking.PREVIOUS, bad)
    if bad and bad != restored:
        rollout.tag_version(
            args.tracking_uri,
            args.model_name,
            bad,
            {rollout.PHASE_TAG: "RolledBack", rollout.REASON_TAG: f"rollback to v{restored}"},
        )
    rollout.log(f"{args.model_name}: champion is v{restored} again (v{bad or '-'} is now previous)")
    return Outputs(champion_version=restored, previous_version=bad)


def _reroute(args: Args, restored: str, bad: str) -> None:
    tags = rollout.version_tags(args.tracking_uri, args.model_name, bad) if bad else {}
    bad_slot: litellm_proxy.Slot | None = (
        "green" if tags.get(rollout.SLOT_TAG) == "green" else ("blue" if bad else None)
    )
    slot = litellm_proxy.other_slot(bad_slot) if bad_slot else litellm_proxy.SLOTS[0]

    def check(adapter: Path) -> None:
        vllm_lora.check_adapter(
            vllm_lora.read_adapter(adapter, "previous"), args.max_lora_rank, args.base_dir, f"previous v{restored}"
        )

    name, _ = rollout.publish_to_slot(args, restored, slot, check, timeout_s=args.timeout_s)
    routes = rollout.routes(args)
    routes.set_weights(litellm_proxy.weights_for(args.model_name, bad_slot, slot, 100.0))
    why = rollout.not_answering(args, restored, slot)
    if why:
        if bad_slot is not None:  # the version that was serving takes the traffic back: no worse than before
            routes.set_weights(litellm_proxy.weights_for(args.model_name, slot, bad_slot, 100.0))
        raise StepFailedError(
            f"v{restored} does not answer its probe set through the proxy ({why}); traffic is back on v{bad} and "
            "the aliases are unchanged"
        )
    rollout.tag_version(
        args.tracking_uri,
        args.model_name,
        restored,
        {rollout.SLOT_TAG: slot, rollout.PHASE_TAG: "Healthy", rollout.REASON_TAG: f"restored by rollback from v{bad}"},
    )
    rollout.log(f"v{restored} serves all of {args.model_name!r} from slot {slot} ({name}) and answers its probe set")


def main(argv: list[str] | None = None) -> int:
    """Entry point: `python -m eksflow.llm.steps.rollback --name=value ...`."""
    return run_step(Args, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
