"""What the rollout steps share: where the fleet is, the rollout's state on FSx, and the registry's view of it.

The rollout is a chain of workflow tasks (serve-champion, load-candidate, shift-<w> / analyze-<w> per canary
step, promote) plus the exit handler (finish-rollout). Each task reads and updates one small state file on the
run's FSx folder, `rollout/state.json`: which version holds which slot, the candidate's current share, how far
the rollout got, and the last failure's one-line reason. The exit handler reads it to know what to undo; Argo's
exit handler cannot read task outputs of the main DAG, and a killed task leaves its last recorded stage there.

Keys never travel as parameters: steps read them from the serving Secret mounted at --secrets-dir (files
`vllm-api-key` and `litellm-master-key`); the local fleet writes the same files into the run's volume.
"""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, Field, ValidationError

from eksflow.llm.steps.common import adapters, litellm_proxy, replicas, tracking, vllm, vllm_client
from eksflow.llm.steps.common.evaluation import evaluated_rows
from eksflow.llm.steps.common.litellm_proxy import Slot
from eksflow.runtime.args import K8S_NAME, Location, StepArgs, StepFailedError, StepInputError
from eksflow.runtime.outputs import atomic_write_text

VLLM_KEY_FILE = "vllm-api-key"
MASTER_KEY_FILE = "litellm-master-key"
SLOT_TAG = "serving.slot"  # on a model version: the slot it was loaded into
PHASE_TAG = "rollout.phase"  # Healthy (promoted) | Degraded (rolled back by the exit handler) | RolledBack
REASON_TAG = "rollout.reason"
WORKFLOW_TAG = "rollout.workflow"
READY_TOKENS = 32  # the readiness answer to a held-out row: enough for the demo task's answers, cheap on CPU
PROBE_ROWS = 8  # held-out rows a restored champion must answer before a rollback reports it serving

Phase = Literal["Progressing", "Healthy", "Degraded", "RolledBack"]
OutputsT = TypeVar("OutputsT", bound=BaseModel)
K8S_NAME_OR_EMPTY = f"^$|{K8S_NAME}"
# A whole model's published name (adapters.published_name), which its own fleet's engine serves it under; "" none
SERVED_NAME_OR_EMPTY = r"^([A-Za-z0-9][A-Za-z0-9._\-]{0,200})?$"


class FleetArgs(StepArgs):
    """Where the serving fleet is and how to reach it (the same on every rollout step)."""

    model_name: str = Field(
        pattern=tracking.MODEL_NAME_PATTERN, description="registered model name; also the public model name served"
    )
    tracking_uri: Location = Field(description="MLflow tracking and registry URI")
    vllm_url: str = Field(
        pattern=r"^$|^https?://", description="the vLLM Service, e.g. http://x.ns.svc.cluster.local:8000"
    )
    proxy_url: str = Field(pattern=r"^$|^https?://", description="the LiteLLM proxy Service")
    fleet: str = Field(
        "",
        pattern=K8S_NAME_OR_EMPTY,
        description="the fleet's Service (prepare-fleet's fleet): its endpoints address every replica; empty: the "
        "vLLM address alone is the one replica",
    )
    secrets_dir: Path = Field(Path("/etc/eksflow/serving"), description="the mounted serving Secret (keys as files)")
    serving_dir: Path = Field(
        description="the fleet's adapter folder on FSx: every engine resolves adapters published there by name"
    )
    routes_file: Path = Field(description="the routes file on FSx that every proxy pod routes by")
    state_file: Path = Field(description="this rollout's state file on FSx (rollout/state.json in the run folder)")


ArgsT = TypeVar("ArgsT", bound=FleetArgs)


class RolloutState(BaseModel):
    """One rollout's progress, rewritten atomically by each task."""

    champion_version: str = ""  # the version serve-champion found holding alias champion ("" = none)
    champion_slot: Slot | None = None
    candidate_version: str = ""
    candidate_slot: Slot | None = None
    champion_adapter: str = ""  # the published adapter names the engines serve them under
    candidate_adapter: str = ""
    percent: float = 0.0  # the candidate's share of the public name's traffic
    vllm_url: str = ""  # the fleet serving the candidate (the exit handler cannot read task outputs)
    fleet: str = ""  # its Service, whose endpoints list every replica ("" = vllm_url is the one replica)
    # The fleet serving the champion: the candidate's too for adapters on one base model; a fleet of its own for a
    # whole model (publish_model), which promote retires once the candidate replaced it.
    champion_vllm_url: str = ""
    champion_fleet: str = ""
    candidate_is_model: bool = False  # served by a fleet of its own (vllm_url, fleet): deleted if rolled back
    stage: str = "started"  # the last step that finished: serve-champion, load-candidate, shift-10, ...
    phase: Phase = "Progressing"
    failure: str = ""  # the last failing step's one-line reason: the exit handler tags the version with it


def read_state(path: Path) -> RolloutState:
    """The state file, or a fresh state when no rollout task has written it yet."""
    try:
        return RolloutState.model_validate_json(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return RolloutState()
    except (OSError, ValidationError) as err:
        raise StepInputError(
            f"--state-file={path} is unreadable ({type(err).__name__}); a rollout task wrote it"
        ) from err


def write_state(path: Path, state: RolloutState) -> None:
    """Replace the state file in one rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, state.model_dump_json(indent=2))


def records_failures(
    step: str | Callable[[Any], str],
) -> Callable[[Callable[[ArgsT], OutputsT]], Callable[[ArgsT], OutputsT]]:
    """Decorate a rollout step's `run(args)`: a failure it raises is recorded as the state's `failure`, then raised.

    The exit handler tags the version with that line. `step` names the step in it: its name, or a function of the
    args for a step run once per canary weight (`analyze-10`, `shift-50`).
    """

    def decorate(run: Callable[[ArgsT], OutputsT]) -> Callable[[ArgsT], OutputsT]:
        @functools.wraps(run)
        def recorded(args: ArgsT) -> OutputsT:
            try:
                return run(args)
            except (StepFailedError, StepInputError) as err:
                name = step if isinstance(step, str) else step(args)
                state = read_state(args.state_file)
                failure = f"{name}: {err}"[: tracking.MAX_TAG_CHARS]
                write_state(args.state_file, state.model_copy(update={"failure": failure}))
                raise

        return recorded

    return decorate


def secret(secrets_dir: Path, name: str) -> str:
    """One key of the mounted serving Secret ("" when it is not there: no fleet to talk to)."""
    try:
        return (secrets_dir / name).read_text(encoding="utf-8").strip()
    except OSError:
        return ""


def routes(args: FleetArgs) -> litellm_proxy.RoutesFile:
    """The routes file every proxy pod of the public name routes by."""
    return litellm_proxy.RoutesFile(args.routes_file, args.model_name)


def publish_to_slot(
    args: FleetArgs, version: str, slot: Slot, check: Callable[[Path], None], *, timeout_s: float
) -> tuple[str, vllm_client.Answer]:
    """Publish `version`'s adapter for the fleet, assign it to `slot` (weight unchanged), load it on every replica.

    The engines resolve it by name at its first request (no load call): `load_everywhere` makes that request on
    every ready replica, so each holds it before any weight moves. Returns the adapter's published name and the
    first replica's answer to the version's first held-out row.
    """
    key = secret(args.secrets_dir, VLLM_KEY_FILE)

    def served_base() -> str:
        card = vllm_client.base_model_card(args.vllm_url, api_key=key)
        if card is None or not card.get("root"):
            raise StepFailedError(f"the vLLM engine at {args.vllm_url} lists no base model: it is not serving")
        return str(card["root"])

    name = adapters.publish(args.tracking_uri, args.model_name, version, args.serving_dir, served_base, check)
    routes(args).assign(slot, name, args.vllm_url)
    return name, load_everywhere(args, version, name, timeout_s=timeout_s)


def route_to_own_fleet(
    args: FleetArgs, version: str, slot: Slot, served_name: str, *, timeout_s: float
) -> vllm_client.Answer:
    """Assign `slot` to a whole model its own fleet (args.vllm_url) serves as `served_name`, then `load_everywhere`.

    Nothing to publish: the fleet's engine loaded the model's folder when it started.
    """
    routes(args).assign(slot, served_name, args.vllm_url)
    return load_everywhere(args, version, served_name, timeout_s=timeout_s)


def load_everywhere(args: FleetArgs, version: str, name: str, *, timeout_s: float) -> vllm_client.Answer:
    """`version`'s published adapter `name` answering on every ready replica and listed by each; the first answer.

    Each replica is asked on its own address (replicas.py) with the first held-out row `evaluate` scored for the
    version (the task, not a generic prompt; the generic readiness prompt only for a version registered without an
    evaluation report), so every one holds the adapter before traffic moves to it; each answer is logged with the
    row's reference. StepFailedError naming each replica that did not load it.
    """
    key = secret(args.secrets_dir, VLLM_KEY_FILE)
    prompt, reference = held_out_rows(args.tracking_uri, args.model_name, version)[0]
    loaded = replicas.load_on_every_replica(
        replicas.replicas(args.fleet, args.vllm_url),
        name,
        api_key=key,
        prompt=prompt,
        max_tokens=READY_TOKENS,
        timeout_s=timeout_s,
    )
    expected = f"(reference {reference!r})" if reference else "(the generic readiness prompt: no evaluation report)"
    for replica, answer in loaded:
        log(f"v{version} ({name}) on {replica.describe()} answered {answer.text!r} to held-out row 0 {expected}")
    log(f"v{version} ({name}) is loaded on every ready replica ({len(loaded)}), each checked on its own address")
    return loaded[0][1]


def wait_routed(args: FleetArgs, slot: Slot, *, timeout_s: float) -> vllm_client.Answer:
    """Until the public name answers through the proxy from `slot`, which the routes file gives all its traffic.

    A proxy pod is ready (and its Service sends it requests) only once the routes file routes the public name
    (eksflow/llm/steps/common/litellm_routes.py), so this waits for the proxy too. StepFailedError naming the proxy, and
    why (the proxy itself named when it does not answer at all), after `timeout_s`.
    """
    key = secret(args.secrets_dir, MASTER_KEY_FILE)
    expected = litellm_proxy.slot_id(args.model_name, slot)
    deadline = time.monotonic() + timeout_s
    while True:
        answer = vllm_client.chat(
            args.proxy_url, args.model_name, vllm.READY_PROMPT, api_key=key, max_tokens=2, timeout_s=60
        )
        if answer.ok and answer.served_by == expected:
            return answer
        if time.monotonic() > deadline:
            got = f"{answer.served_by} answered" if answer.ok else f"{answer.status or 'no answer'} ({answer.error})"
            down = litellm_proxy.proxy_down(args.proxy_url) if not answer.status else ""
            raise StepFailedError(
                f"the public name {args.model_name!r} is not answered from {expected} through the proxy after "
                f"{timeout_s:g} s ({down or 'last: ' + got}); the routes file is {args.routes_file}"
            )
        time.sleep(1.0)


def not_answering(args: FleetArgs, version: str, slot: Slot, *, timeout_s: float = 60) -> str:
    """Why the public name does not answer the version's probe set from `slot`, "" when it answers every row.

    The probe set is the first PROBE_ROWS held-out rows `evaluate` scored for the version (the generic readiness
    prompt for a version without a report), sent through the proxy as a user's request: this proves the routing
    and the engine behind it at once.
    """
    key = secret(args.secrets_dir, MASTER_KEY_FILE)
    expected = litellm_proxy.slot_id(args.model_name, slot)
    for i, (prompt, _) in enumerate(held_out_rows(args.tracking_uri, args.model_name, version)[:PROBE_ROWS]):
        answer = vllm_client.chat(
            args.proxy_url, args.model_name, prompt, api_key=key, max_tokens=READY_TOKENS, timeout_s=timeout_s
        )
        if not answer.ok:
            return f"probe row {i} got {answer.status or 'no answer'} ({answer.error or 'empty answer'})"
        if answer.served_by != expected:
            return f"probe row {i} was answered by {answer.served_by or 'an unknown deployment'}, not {expected}"
    return ""


def held_out_rows(tracking_uri: str, model_name: str, version: str) -> list[tuple[vllm_client.Prompt, str]]:
    """(what the row was asked, reference) of the held-out rows `evaluate` scored for the version, in order.

    A conversation's row is asked with its whole history (its "messages"), a pair's with its prompt. Just the
    generic readiness prompt, with no reference, for a version registered without an evaluation report.
    """
    try:
        rows = evaluated_rows(tracking_uri, model_name, version)
    except StepInputError:
        rows = []
    asked = [(evaluated_prompt(r), str(r.get("reference", ""))) for r in rows if "prompt" in r]
    return asked or [(vllm.READY_PROMPT, "")]


def evaluated_prompt(row: Mapping[str, object]) -> vllm_client.Prompt:
    """What evaluate asked on a report row: its history (a conversation's), else its prompt."""
    return evaluated_history(row) or str(row["prompt"])


def evaluated_history(row: Mapping[str, object]) -> list[dict[str, Any]]:
    """The history a conversation's report row was asked with ("messages"); [] for a pair's row."""
    messages = row.get("messages")
    if isinstance(messages, list) and all(isinstance(m, dict) for m in messages):
        return [dict(m) for m in messages]
    return []


def version_tags(tracking_uri: str, model_name: str, version: str) -> dict[str, str]:
    """The tags of a registered version (StepInputError if there is no such version)."""
    return dict(adapters.registered_version(tracking_uri, model_name, version).tags or {})


def tag_version(tracking_uri: str, model_name: str, version: str, tags: dict[str, str]) -> None:
    """Set tags on a version (values cut to MLflow's limit)."""
    with tracking.errors(tracking_uri, f"tagging {model_name} version {version}"):
        client = tracking.client(tracking_uri)
        for key, value in tags.items():
            client.set_model_version_tag(model_name, version, key, value[: tracking.MAX_TAG_CHARS])


def champion_version(tracking_uri: str, model_name: str) -> str:
    """The version holding alias `champion`, "" when none."""
    found = tracking.alias_version(tracking_uri, model_name, tracking.CHAMPION)
    return "" if found is None else str(found.version)


def best_effort(what: str, action: Callable[[], object]) -> bool:
    """Run a clean-up action; on failure print one warning line and go on (the exit handler must finish)."""
    try:
        action()
    except (StepFailedError, StepInputError, OSError) as err:
        print(f"warning: could not {what}: {err}", file=sys.stderr, flush=True)
        return False
    return True


def log(message: str) -> None:
    """One progress line on stderr (the task's log in the Argo UI)."""
    print(message, file=sys.stderr, flush=True)
