r"""Put the candidate on the serving fleet: its adapter published, in the slot the champion does not hold, at weight 0.

    python -m eksflow.llm.steps.load_candidate --model-name=llama-lora --model-version=4 --evaluated-champion=3 \
        --tracking-uri=... --vllm-url=... --proxy-url=... --serving-dir=... --routes-file=... --state-file=... \
        --base-dir=...

Bad input exits 2 before any server is asked: a version without its adapter folder, an adapter whose rank is
above the engine's --max-lora-rank, an adapter trained on another base model (its tensor shapes against the base
model folder the engine serves, and the version's `base_model` tag against the fleet's), or one vLLM can only
serve merged (eksflow/llm/steps/common/vllm.py says when). RO4: if `champion` moved since `evaluate` judged the
candidate against it (--evaluated-champion, empty when there was no champion then), the candidate never beat the
champion it would replace, and the rollout stops (exit 1). A candidate older than the champion (a version registered
before it: a rerun that trained an earlier version's weights again) is never rolled out over it: exit 2, in one line
naming both versions.

The adapter is published to the fleet's adapter folder (eksflow/llm/steps/common/adapters.py: every engine resolves it
by name, no load call) and assigned to the free slot in the routes file at weight 0 (the champion keeps every
request); it must answer a real generation before the task succeeds. A whole model (train.finetune=full) is served
by a fleet of its own, which the rollout applied from publish-candidate's outputs: --served-name is the name its
engine serves it under, --vllm-url and --fleet that fleet's Service; its slot is routed to that engine, and every
replica of it must answer.

A candidate that is already the champion (a rerun on unchanged data registers the same version) is not rolled
out: the step says so in one line, loads nothing, and outputs rolls_out=false, which skips the canary steps and
promote; `previous` keeps naming the version before the champion, never the champion itself.

Outputs (one file each under --outputs-dir):
    rolls_out       false when the candidate is the champion already: nothing to roll out
    candidate_slot  blue or green ("" when nothing rolls out)
    adapter         the published adapter's name, which the engines serve it under ("" when nothing rolls out)
    answer          the candidate's answer to the first held-out row `evaluate` scored (its readiness check)
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field

from eksflow.llm.steps import register
from eksflow.llm.steps.common import adapters, chat_template, litellm_proxy, rollout, tracking, vllm_lora
from eksflow.llm.steps.common.rollout import FleetArgs
from eksflow.runtime.args import Location, StepFailedError, StepInputError, run_step

STEP = "load-candidate"


class Args(FleetArgs):
    """The candidate version, the fleet, and what `evaluate` compared the candidate with."""

    model_version: str = Field(pattern=r"^[1-9][0-9]*$", description="register's model_version")
    evaluated_champion: str | None = Field(
        None,
        pattern=r"^([1-9][0-9]*)?$",
        description="evaluate's champion_version: the champion the candidate was judged against, empty when none; "
        "not given: no evaluation to check (a registered version rolled out again)",
    )
    base_model: Location = Field(description="the fleet's base model reference (the workflow's base_model)")
    base_dir: Path = Field(
        description="the fleet's base model folder (tasks.prepare-fleet.outputs.parameters.model_dir)"
    )
    max_lora_rank: int = Field(16, ge=1, description="the engine's --max-lora-rank (serving.engine.max_lora_rank)")
    served_name: str = Field(
        "",
        pattern=rollout.SERVED_NAME_OR_EMPTY,
        description="a whole-model candidate: the name its own fleet's engine serves it under (publish-candidate's "
        "served_name); empty: an adapter, published to the fleet's base model engine",
    )
    workflow_name: str = Field("", description="the rollout's workflow, {{workflow.name}} (tag on the version)")
    timeout_s: int = Field(300, ge=1, description="seconds for the candidate's first answer")


class Outputs(BaseModel):
    """Argo output parameters."""

    rolls_out: bool
    candidate_slot: str
    adapter: str
    answer: str


def check_candidate(args: Args, adapter: Path | None) -> None:
    """Every input check of the candidate (its adapter folder; None: a whole model), exit 2 on any; no server asked."""
    registered = adapters.registered_version(args.tracking_uri, args.model_name, args.model_version)  # read once
    tags = dict(registered.tags or {})
    if tracking.is_model(registered) != bool(args.served_name):
        served = "on a fleet of its own (--served-name)" if args.served_name else "as an adapter on its base model"
        raise StepInputError(
            f"--model-version={args.model_version}: {args.model_name} v{args.model_version} is "
            f"{'a whole model' if tracking.is_model(registered) else 'an adapter'}, and this rollout serves its "
            f"candidate {served}; roll it out with the pipeline (train.finetune) that trained it"
        )
    trained_on = tags.get("base_model", "")
    if trained_on and trained_on != args.base_model:
        raise StepInputError(
            f"--base-model: {args.model_name} version {args.model_version} was trained on {trained_on!r}, this "
            f"fleet serves {args.base_model!r}; roll it out on a fleet of its base model (run with that base_model)"
        )
    if problem := chat_template.serving_problem(args.tracking_uri, str(registered.run_id or ""), args.base_dir):
        raise StepInputError(f"--model-version={args.model_version}: {problem}")
    if adapter is None:
        return
    # The version's tags say what kind of adapter it is (register.adapter_tags): refused before its folder is read
    targets = tags.get(register.TARGET_MODULES_TAG, "")
    unservable = vllm_lora.unservable_setting(
        tags.get(register.USE_DORA_TAG) == "true", targets.split(",") if targets else ()
    )
    if unservable is not None:
        field, why, fix = unservable
        raise StepInputError(
            f"--model-version={args.model_version}: its tags record train.lora.{field}={tags.get(f'lora.{field}')}: "
            f"{why}; serve it merged into its base as a model, or retrain it ({fix})"
        )
    spec = vllm_lora.read_adapter(adapter, "--model-version")
    vllm_lora.check_adapter(spec, args.max_lora_rank, args.base_dir, f"--model-version={args.model_version}")


def progressing_tags(slot: str, workflow_name: str) -> dict[str, str]:
    """The version's tags as its canary starts: every rollout tag set anew, so none tells of an earlier rollout."""
    return {
        rollout.SLOT_TAG: slot,
        rollout.PHASE_TAG: "Progressing",
        rollout.REASON_TAG: f"canary started by {workflow_name}",
        rollout.WORKFLOW_TAG: workflow_name,
    }


def champion_moved(compared: str | None, current: str | None) -> str:
    """Why the candidate may not load: the champion it was compared with is no longer the champion (RO4)."""
    was = f"compared with v{compared}" if compared else "compared with no champion"
    now = f"is now v{current}" if current else "is now unset"
    return (
        f"champion moved: the candidate was {was}, `champion` {now} (another rollout promoted meanwhile); "
        "rerun the pipeline to evaluate against the new champion (RO4)"
    )


def older_than_champion(model_name: str, candidate: str, current: str) -> str:
    """Why the candidate may not replace the champion: it is an earlier version ("" when it is not)."""
    if not current or int(candidate) >= int(current):
        return ""
    return (
        f"--model-version={candidate}: {model_name} v{candidate} was registered before the champion v{current} (a "
        "rerun that trains its weights again finds it registered); an older version is never rolled out over a newer "
        "champion"
    )


@rollout.records_failures(STEP)
def run(args: Args) -> Outputs:
    """Check the candidate, publish it into the free slot at weight 0, prove it answers."""
    state = rollout.read_state(args.state_file)
    current = rollout.champion_version(args.tracking_uri, args.model_name)
    if args.model_version == current:
        rollout.write_state(args.state_file, state.model_copy(update={"stage": STEP}))
        rollout.log(
            f"v{args.model_version} is already the champion of {args.model_name!r} (slot {state.champion_slot}): "
            "nothing to roll out"
        )
        return Outputs(rolls_out=False, candidate_slot="", adapter="", answer="")
    if older := older_than_champion(args.model_name, args.model_version, current):
        raise StepInputError(older)
    evaluated = state.champion_version if args.evaluated_champion is None else args.evaluated_champion
    if current != state.champion_version or evaluated != current:
        raise StepFailedError(champion_moved(evaluated, current))
    slot = litellm_proxy.other_slot(state.champion_slot) if state.champion_slot else litellm_proxy.SLOTS[0]
    if state.champion_slot is not None:  # the champion keeps all traffic until the first canary step
        rollout.routes(args).set_weights(litellm_proxy.weights_for(args.model_name, state.champion_slot, slot, 0.0))
    else:  # no weight left by an earlier rollout: the candidate answers no user before its analysis
        rollout.routes(args).withdraw(slot)
    if args.served_name:  # a whole model, on its own fleet (the rollout applied it): its engine serves it already
        check_candidate(args, None)
        name = args.served_name
        answer = rollout.route_to_own_fleet(args, args.model_version, slot, name, timeout_s=args.timeout_s)
    else:
        name, answer = rollout.publish_to_slot(
            args, args.model_version, slot, lambda adapter: check_candidate(args, adapter), timeout_s=args.timeout_s
        )
    rollout.tag_version(
        args.tracking_uri,
        args.model_name,
        args.model_version,
        progressing_tags(slot, args.workflow_name),
    )
    rollout.write_state(
        args.state_file,
        state.model_copy(
            update={
                "candidate_version": args.model_version,
                "candidate_slot": slot,
                "candidate_adapter": name,
                "stage": STEP,
                "vllm_url": args.vllm_url,
                "fleet": args.fleet,
                "candidate_is_model": bool(args.served_name),
            }
        ),
    )
    rollout.log(f"candidate v{args.model_version} published as {name}, in slot {slot} at weight 0")
    return Outputs(rolls_out=True, candidate_slot=slot, adapter=name, answer=answer.text)


def main(argv: list[str] | None = None) -> int:
    """Entry point: `python -m eksflow.llm.steps.load_candidate --name=value ...`."""
    return run_step(Args, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
