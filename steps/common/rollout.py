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

import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, Field, ValidationError

from eksflow.runtime.args import Location, StepArgs, StepFailedError, StepInputError
from eksflow.runtime.outputs import atomic_write_text
from steps.common import litellm_proxy, tracking
from steps.common.litellm_proxy import Slot

if TYPE_CHECKING:
    from mlflow.entities.model_registry import ModelVersion

VLLM_KEY_FILE = "vllm-api-key"
MASTER_KEY_FILE = "litellm-master-key"
SLOT_TAG = "serving.slot"  # on a model version: the slot it was loaded into
PHASE_TAG = "rollout.phase"  # Healthy (promoted) | Degraded (rolled back by the exit handler) | RolledBack
REASON_TAG = "rollout.reason"
WORKFLOW_TAG = "rollout.workflow"

Phase = Literal["Progressing", "Healthy", "Degraded", "RolledBack"]


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
    secrets_dir: Path = Field(Path("/etc/eksflow/serving"), description="the mounted serving Secret (keys as files)")
    serving_dir: Path = Field(description="shared folder the fleet loads adapters from (FSx), one folder per version")
    state_file: Path = Field(description="this rollout's state file on FSx (rollout/state.json in the run folder)")


class RolloutState(BaseModel):
    """One rollout's progress, rewritten atomically by each task."""

    champion_version: str = ""  # the version serve-champion found holding alias champion ("" = none)
    champion_slot: Slot | None = None
    candidate_version: str = ""
    candidate_slot: Slot | None = None
    percent: float = 0.0  # the candidate's share of the public name's traffic
    vllm_url: str = ""  # the fleet serving the candidate (the exit handler cannot read task outputs)
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


@contextmanager
def recording_failures(path: Path, step: str) -> Iterator[None]:
    """Record any failure of the block as the state's `failure` (for the exit handler), then let it propagate."""
    try:
        yield
    except (StepFailedError, StepInputError) as err:
        state = read_state(path)
        write_state(path, state.model_copy(update={"failure": f"{step}: {err}"[: tracking.MAX_TAG_CHARS]}))
        raise


def secret(secrets_dir: Path, name: str) -> str:
    """One key of the mounted serving Secret ("" when it is not there: no fleet to talk to)."""
    try:
        return (secrets_dir / name).read_text(encoding="utf-8").strip()
    except OSError:
        return ""


def routes(args: FleetArgs) -> litellm_proxy.Routes:
    """How this step changes the proxy's weights (routes file locally, management API in the cluster)."""
    return litellm_proxy.routes(
        args.proxy_url, secret(args.secrets_dir, MASTER_KEY_FILE), args.model_name, args.vllm_url
    )


def registered_version(tracking_uri: str, model_name: str, version: str) -> ModelVersion:
    """A registered version; StepInputError naming --model-version when the registry has no such version."""
    from mlflow.exceptions import MlflowException

    tracking.require_registry(tracking_uri)
    with tracking.errors(tracking_uri, f"reading {model_name} version {version}"):
        try:
            return tracking.client(tracking_uri).get_model_version(model_name, version)
        except MlflowException as err:
            if err.error_code not in tracking.NOT_FOUND_CODES:
                raise
    raise StepInputError(
        f"--model-version={version}: {model_name!r} has no version {version} at {tracking_uri}; pass register's "
        "output (tasks.register.outputs.parameters.model_version)"
    )


def download_adapter(tracking_uri: str, model_name: str, version: str, serving_dir: Path) -> Path:
    """The version's adapter folder under `serving_dir/v<version>` (downloaded once: versions are immutable)."""
    import mlflow
    from mlflow.exceptions import MlflowException

    target = serving_dir / f"v{version}"
    if (target / "adapter_config.json").is_file():
        return target
    registered = registered_version(tracking_uri, model_name, version)
    serving_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".v{version}.", dir=serving_dir))
    try:
        try:
            local = Path(
                mlflow.artifacts.download_artifacts(
                    run_id=str(registered.run_id), artifact_path=tracking.ADAPTER_ARTIFACT, dst_path=str(tmp)
                )
            )
        except (MlflowException, OSError) as err:
            raise StepInputError(
                f"--model-version={version}: {model_name} version {version} has no "
                f"{tracking.ADAPTER_ARTIFACT!r} artifact in run {registered.run_id} ({type(err).__name__}); "
                "register it with steps.register"
            ) from err
        if not (local / "adapter_config.json").is_file():
            raise StepInputError(
                f"--model-version={version}: the {tracking.ADAPTER_ARTIFACT!r} artifact of {model_name} "
                f"version {version} holds no adapter_config.json (missing adapter folder); register the train "
                "step's adapter_dir"
            )
        shutil.rmtree(target, ignore_errors=True)
        os.replace(local, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def version_tags(tracking_uri: str, model_name: str, version: str) -> dict[str, str]:
    """The tags of a registered version (StepInputError if there is no such version)."""
    return dict(registered_version(tracking_uri, model_name, version).tags or {})


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
