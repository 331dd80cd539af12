r"""Make sure the fleet serves the champion: its adapter loaded in its slot, all of the public name's traffic on it.

    python -m steps.serve_champion --model-name=llama-lora --tracking-uri=... --vllm-url=... --proxy-url=... \
        --serving-dir=/fsx/serving/llama-lora --state-file=/fsx/runs/<wf>/rollout/state.json --base-dir=/fsx/models/m

Idempotent, and the first rollout task: a fleet just started (every local run, a restarted pod) has no adapter
loaded yet; a fleet already serving the champion is left as it is. The champion's slot is its `serving.slot` tag
(blue for a version that has none). The state file records the champion this rollout compares against and, at
promotion, moves `champion` from (RO4). A champion trained on another base model cannot share this fleet's
engine: the rollout then goes ahead without a live champion (its recorded scores still gated `evaluate`).

Outputs (one file each under --outputs-dir):
    champion_version  the version serving as champion, empty when there is none (yet, or on this engine)
    champion_slot     its slot (blue or green), empty when none
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field

from eksflow.runtime.args import StepInputError, run_step
from steps.common import litellm_proxy, rollout, vllm
from steps.common.rollout import FleetArgs, RolloutState

STEP = "serve-champion"


class Args(FleetArgs):
    """The fleet, plus the base model folder its engine serves (for the adapter's shape check)."""

    base_dir: Path = Field(
        description="the fleet's base model folder (tasks.prepare-fleet.outputs.parameters.model_dir)"
    )
    max_lora_rank: int = Field(16, ge=1, description="the engine's --max-lora-rank (serving.engine.max_lora_rank)")
    timeout_s: int = Field(300, ge=1, description="seconds for the adapter's first answer")


class Outputs(BaseModel):
    """Argo output parameters."""

    champion_version: str
    champion_slot: str


def run(args: Args) -> Outputs:
    """Load the champion into its slot and route the public name to it."""
    with rollout.recording_failures(args.state_file, STEP):
        return _run(args)


def _run(args: Args) -> Outputs:
    version = rollout.champion_version(args.tracking_uri, args.model_name)
    if not version:
        rollout.log(f"{args.model_name} has no champion yet: the first candidate takes all traffic once it passes")
        rollout.write_state(args.state_file, RolloutState(stage=STEP, vllm_url=args.vllm_url))
        return Outputs(champion_version="", champion_slot="")
    adapter = rollout.download_adapter(args.tracking_uri, args.model_name, version, args.serving_dir)
    try:
        vllm.check_adapter(
            vllm.read_adapter(adapter, "champion"), args.max_lora_rank, args.base_dir, f"champion v{version}"
        )
    except StepInputError as err:  # not this engine's: the old fleet keeps serving it (cluster); compare offline
        rollout.log(f"champion v{version} cannot be served on this fleet ({err}); rollout without a live champion")
        rollout.write_state(args.state_file, RolloutState(stage=STEP, vllm_url=args.vllm_url))
        return Outputs(champion_version="", champion_slot="")
    tags = rollout.version_tags(args.tracking_uri, args.model_name, version)
    slot: litellm_proxy.Slot = "green" if tags.get(rollout.SLOT_TAG) == "green" else "blue"
    name = litellm_proxy.slot_id(args.model_name, slot)
    api_key = rollout.secret(args.secrets_dir, rollout.VLLM_KEY_FILE)
    if vllm.loaded_adapters(args.vllm_url, api_key=api_key).get(name) != str(adapter):
        vllm.load_adapter(args.vllm_url, name, adapter, api_key=api_key)
    answer = vllm.wait_ready(args.vllm_url, name, api_key=api_key, timeout_s=args.timeout_s)
    routes = rollout.routes(args)
    routes.point(name, args.vllm_url)
    routes.set_weights(litellm_proxy.weights_for(args.model_name, slot, litellm_proxy.other_slot(slot), 0.0))
    rollout.tag_version(args.tracking_uri, args.model_name, version, {rollout.SLOT_TAG: slot})
    rollout.write_state(
        args.state_file,
        RolloutState(champion_version=version, champion_slot=slot, stage=STEP, vllm_url=args.vllm_url),
    )
    rollout.log(f"champion v{version} serves from slot {slot} ({name}), all traffic; it answered {answer.text!r}")
    return Outputs(champion_version=version, champion_slot=slot)


def main(argv: list[str] | None = None) -> int:
    """Entry point: `python -m steps.serve_champion --name=value ...`."""
    return run_step(Args, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
