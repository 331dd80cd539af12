r"""Finish the rollout: the candidate becomes `champion` (compare-and-set) and takes all traffic.

    python -m eksflow.llm.steps.promote --model-name=llama-lora --tracking-uri=... --vllm-url=... --proxy-url=... \
        --state-file=...

In order:
1. every ready replica of the fleet, each on its own address, answers from the candidate's adapter and lists it
   (a pod that joined during the canary loads it now);
2. the candidate takes 100% of the public name (already so after a canary step of 100%);
3. compare-and-set (RO4): `champion` must still be the version this rollout started from (the one the canary
   compared against); if another rollout moved it meanwhile, nothing is promoted (exit 1, the exit handler routes
   the traffic back). MLflow has no atomic alias update, so the alias is read back after the move as well: a
   writer that slipped in between is reported, never silently overwritten twice;
4. `champion` moves to the candidate and the former champion gets `previous` (the `rollback` command's target);
   its slot keeps weight 0 and its adapter stays published, so a rollback needs no download and requests it was
   answering finish on their own;
5. a request to the public name through the proxy proves the result: the first held-out row `evaluate` scored for
   the version, as a user of the task would ask it (the generic readiness prompt only for a version registered
   without an evaluation report); the version is tagged rollout.phase=Healthy.
6. a former champion served by a fleet of its own (a whole model: eksflow/llm/steps/publish_model.py) is retired:
   its slot leaves the routes file and `retired` names its fleet, whose Deployment, Service and
   PodDisruptionBudget the rollout then deletes. A rollback to it applies its fleet again.

Outputs (one file each under --outputs-dir):
    champion_version  the new champion
    previous_version  the former champion ("" for a first deployment)
    answer            the public name's answer, through the proxy, to the first held-out row `evaluate` scored;
                      empty for a version without an evaluation report (its answer to a generic prompt says
                      nothing of the task)
    retired           the former champion's own fleet, to delete ("" when it shares the candidate's, or none)
    retires           whether there is one (the rollout's condition for deleting it)
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from eksflow.llm.steps.common import litellm_proxy, rollout, tracking, vllm_client
from eksflow.llm.steps.common.rollout import FleetArgs
from eksflow.runtime.args import StepFailedError, StepInputError, run_step

STEP = "promote"


class Args(FleetArgs):
    """The fleet, and how long the final request through the proxy may take."""

    request_timeout_s: int = Field(120, ge=1, description="seconds for the final request through the proxy")


class Outputs(BaseModel):
    """Argo output parameters."""

    champion_version: str
    previous_version: str
    answer: str
    retired: str = ""
    retires: bool = False


def compare_and_set(tracking_uri: str, model_name: str, expected: str, candidate: str) -> None:
    """Move `champion` to `candidate` only if it is still `expected` ("" = unset); StepFailedError otherwise."""
    current = rollout.champion_version(tracking_uri, model_name)
    if current != expected:
        raise StepFailedError(
            f"not promoting v{candidate}: `champion` moved from v{expected or 'unset'} to v{current or 'unset'} "
            "while this rollout ran (another rollout promoted); it was compared with the old one (RO4)"
        )
    with tracking.errors(tracking_uri, f"promoting {model_name} version {candidate}"):
        tracking.promote(tracking_uri, model_name, candidate)
    after = rollout.champion_version(tracking_uri, model_name)
    if after != candidate:
        raise StepFailedError(
            f"`champion` is v{after} right after moving it to v{candidate}: another writer raced this promotion; "
            "check the registry and run `rollback` if needed (RO4)"
        )


@rollout.records_failures(STEP)
def run(args: Args) -> Outputs:
    """Route everything to the candidate, compare-and-set `champion`, prove the public name answers from it."""
    state = rollout.read_state(args.state_file)
    if state.candidate_slot is None or not state.candidate_version:
        raise StepInputError(f"--state-file={args.state_file} names no candidate: run load-candidate first")
    candidate = litellm_proxy.slot_id(args.model_name, state.candidate_slot)
    # Every replica holds the candidate before it takes all traffic: a pod that joined the fleet during the canary
    # loads it now, not at a user's request.
    rollout.load_everywhere(args, state.candidate_version, state.candidate_adapter, timeout_s=args.request_timeout_s)
    # Traffic first: if the alias cannot move, the exit handler routes it back; the alias never points at a
    # version that does not take the traffic.
    routes = rollout.routes(args)
    routes.set_weights(litellm_proxy.weights_for(args.model_name, state.champion_slot, state.candidate_slot, 100.0))
    compare_and_set(args.tracking_uri, args.model_name, state.champion_version, state.candidate_version)
    state = state.model_copy(update={"percent": 100.0, "stage": STEP, "phase": "Healthy"})
    rollout.write_state(args.state_file, state)
    key = rollout.secret(args.secrets_dir, rollout.MASTER_KEY_FILE)
    prompt, reference = rollout.held_out_rows(args.tracking_uri, args.model_name, state.candidate_version)[0]
    answer = vllm_client.chat(
        args.proxy_url,
        args.model_name,
        prompt,
        api_key=key,
        max_tokens=rollout.READY_TOKENS,
        timeout_s=args.request_timeout_s,
    )
    if not answer.ok or answer.served_by != candidate:
        raise StepFailedError(
            f"after promotion the public name {args.model_name!r} answered {answer.status} from "
            f"{answer.served_by or 'nobody'} ({answer.error}), expected the new champion {candidate}"
        )
    rollout.tag_version(
        args.tracking_uri,
        args.model_name,
        state.candidate_version,
        {rollout.PHASE_TAG: "Healthy", rollout.REASON_TAG: "promoted"},
    )
    rollout.log(f"v{state.candidate_version} is champion, serving all of {args.model_name!r} from {candidate}")
    retired = retired_fleet(state)
    if retired and state.champion_slot is not None:
        routes.withdraw(state.champion_slot)  # no request goes there again: its fleet is deleted next
        rollout.log(f"v{state.champion_version}'s own fleet {retired} is retired")
    task_answer = answer.text if reference else ""  # only a held-out row's answer tells of the task
    if task_answer:
        rollout.log(f"{args.model_name!r} answered {task_answer!r} to held-out row 0 (reference {reference!r})")
    return Outputs(
        champion_version=state.candidate_version,
        previous_version=state.champion_version,
        answer=task_answer,
        retired=retired,
        retires=bool(retired),
    )


def retired_fleet(state: rollout.RolloutState) -> str:
    """The former champion's fleet when it was its own (a whole model's), not the candidate's; "" otherwise."""
    return state.champion_fleet if state.champion_fleet and state.champion_fleet != state.fleet else ""


def main(argv: list[str] | None = None) -> int:
    """Entry point: `python -m eksflow.llm.steps.promote --name=value ...`."""
    return run_step(Args, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
