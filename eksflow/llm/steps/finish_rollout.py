r"""The rollout's exit handler: roll back whatever did not finish; record the outcome on the candidate version.

    python -m eksflow.llm.steps.finish_rollout --workflow-status={{workflow.status}} --model-name=llama-lora ... \
        --state-file=...

Argo runs it when the workflow ends however it ends: succeeded, a task failed (a canary analysis, a killed
server), or the workflow was stopped or hit its deadline. If the rollout reached promotion there is nothing to
undo (rollout.phase=Healthy). Otherwise, with a candidate on the fleet: every request of the public name goes
back to the champion's slot (without a champion, the candidate's slot loses its weight: the proxy answers the name
503 until a rollout routes it), the candidate's adapter is unpublished (no engine can resolve it again) and then
unloaded from every replica of the fleet, each addressed on its own by the fleet Service's endpoints and checked
after (eksflow/llm/steps/common/replicas.py), and the candidate version is tagged rollout.phase=Degraded with the
reason (the failing step's own message, from the state file).
A whole-model candidate (train.finetune=full) has a fleet of its own instead of an adapter: `discarded` names
it, and the exit handler deletes its Deployment, Service and PodDisruptionBudget next.
`champion` never moved, so the registry needs no repair. Clean-up against a fleet that is gone (a killed engine)
is reported and skipped; the tags are always written. A run that never loaded a candidate (the gate failed,
training was skipped) has nothing to undo.

After a rollback the champion must answer its probe set (the first held-out rows `evaluate` scored for it) through
the proxy, from its slot, before the task says it is serving: an engine that died takes the champion down with the
candidate, and routing back then restores no service; the task names what is down, the engine or the proxy.

Outputs (one file each under --outputs-dir):
    phase             Healthy, Degraded, or empty when no candidate was rolled out
    reason            why
    champion_serving  after a rollback to a champion: true if it answered its probe set, false if not; else empty
    candidate_left_on after a rollback: the replicas that still list the candidate, or could not be checked (why);
                      empty when every replica was checked and none holds it
    discarded         after a rollback: the whole-model candidate's own fleet, to delete; else empty
    discards          whether there is one (the exit handler's condition for deleting it)
"""

from __future__ import annotations

import sys

from pydantic import BaseModel, Field

from eksflow.llm.steps.common import adapters, litellm_proxy, replicas, rollout, vllm_client
from eksflow.llm.steps.common.rollout import FleetArgs, RolloutState
from eksflow.runtime.args import StepFailedError, run_step


class Args(FleetArgs):
    """The fleet, and how the workflow ended."""

    workflow_status: str = Field(description="{{workflow.status}}: Succeeded, Failed or Error")
    vllm_url: str = Field("", pattern=r"^$|^https?://", description="the fleet; empty: the one the state file names")


class Outputs(BaseModel):
    """Argo output parameters."""

    phase: str
    reason: str
    champion_serving: str = ""  # after a rollback: "true" when the champion answered its probe set, else "false"
    candidate_left_on: str = ""  # after a rollback: replicas still holding the candidate or not checked ("" = none)
    discarded: str = ""  # after a rollback: the whole-model candidate's own fleet, which the exit handler deletes
    discards: bool = False


def run(args: Args) -> Outputs:
    """Nothing to do, or roll back to the champion and tag the candidate Degraded."""
    state = rollout.read_state(args.state_file)
    if not state.candidate_version or state.candidate_slot is None:
        rollout.log(f"workflow {args.workflow_status}: no candidate was put on the fleet; nothing to roll back")
        return Outputs(phase="", reason="no candidate")
    if state.phase == "Healthy":
        rollout.log(f"v{state.candidate_version} was promoted; nothing to roll back")
        return Outputs(phase="Healthy", reason="promoted")
    reason = state.failure or f"workflow {args.workflow_status} before promotion (last finished: {state.stage})"
    key = rollout.secret(args.secrets_dir, rollout.VLLM_KEY_FILE)
    candidate_slot = state.candidate_slot
    if state.champion_slot is not None:
        weights = litellm_proxy.weights_for(args.model_name, state.champion_slot, candidate_slot, 0.0)
        rollout.best_effort("route traffic back to the champion", lambda: rollout.routes(args).set_weights(weights))
    else:  # nothing to route back to: the public name is refused (503) rather than answered by a failed candidate
        rollout.best_effort("take the traffic off the candidate", lambda: rollout.routes(args).withdraw(candidate_slot))
    vllm_url = args.vllm_url or state.vllm_url
    discarded = state.fleet if state.candidate_is_model else ""  # its fleet goes whole: nothing to unload
    left_on = _withdraw(args, state, vllm_url, key) if state.candidate_adapter and not discarded else ""
    rollout.tag_version(
        args.tracking_uri,
        args.model_name,
        state.candidate_version,
        {rollout.PHASE_TAG: "Degraded", rollout.REASON_TAG: reason},
    )
    rollout.write_state(args.state_file, state.model_copy(update={"phase": "Degraded", "percent": 0.0}))
    rolled = f"rolled back v{state.candidate_version} (Degraded): {reason}"
    if state.champion_slot is None or not state.champion_version:
        rollout.log(f"{rolled}; no champion to serve")
        return Outputs(
            phase="Degraded", reason=reason, candidate_left_on=left_on, discarded=discarded, discards=bool(discarded)
        )
    why = rollout.not_answering(args, state.champion_version, state.champion_slot, timeout_s=30)
    champion_url = state.champion_vllm_url or vllm_url
    champion = f"champion v{state.champion_version}"
    if not why:
        rollout.log(f"{rolled}; traffic on {champion}, which answers its probe set through the proxy")
    else:
        rollout.log(
            f"{rolled}; traffic is routed to {champion}, but it is NOT serving ({_cause(args, champion_url, why)})"
        )
    return Outputs(
        phase="Degraded",
        reason=reason,
        champion_serving=str(not why).lower(),
        candidate_left_on=left_on,
        discarded=discarded,
        discards=bool(discarded),
    )


def _cause(args: Args, vllm_url: str, why: str) -> str:
    """Which part of the fleet is down, and what brings it back; else why the probes failed."""
    engine_down = vllm_client.engine_down(vllm_url) if vllm_url else "no fleet address"
    if engine_down:
        return (
            f"{engine_down}: in the cluster its Deployment restarts the engine; here, bring the champion back with "
            "`make serve`"
        )
    if down := litellm_proxy.proxy_down(args.proxy_url):
        return (
            f"{down}; the engine is up: in the cluster the proxy's Deployment restarts it; here, `make serve` serves "
            "the champion without the proxy"
        )
    return why


def _withdraw(args: Args, state: RolloutState, vllm_url: str, key: str) -> str:
    """Unpublish the candidate's adapter (no engine resolves it again), then unload it from every replica.

    Each replica is checked on its own address after; returns the ones still holding it or not checked (why), ""
    when none. Against a fleet that cannot be listed or reached, a warning line each, and the rollback goes on.
    """
    adapter = state.candidate_adapter
    rollout.best_effort(
        f"unpublish the candidate's adapter {adapter}", lambda: adapters.unpublish(args.serving_dir, adapter)
    )
    if not vllm_url:
        return ""
    try:
        fleet = replicas.replicas(state.fleet, vllm_url)
    except StepFailedError as err:
        print(f"warning: could not list the fleet's replicas to unload {adapter}: {err}", file=sys.stderr, flush=True)
        return f"every replica (not listed: {err})"
    holding, unchecked = replicas.unload_from_every_replica(fleet, adapter, api_key=key)
    left = [f"{r.describe()} still lists it" for r in holding]
    left += [f"{r.describe()} (not checked: {why})" for r, why in unchecked.items()]
    if left:
        print(f"warning: {adapter} is not off every replica: {'; '.join(left)}", file=sys.stderr, flush=True)
    else:
        rollout.log(f"{adapter} is on no replica: {replicas.described(fleet)} checked, each on its own address")
    return "; ".join(left)


def main(argv: list[str] | None = None) -> int:
    """Entry point: `python -m eksflow.llm.steps.finish_rollout --name=value ...`."""
    return run_step(Args, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
