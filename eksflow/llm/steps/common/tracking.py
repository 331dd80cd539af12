"""MLflow tracking and registry helpers shared by the train, register and rollout steps.

Every function takes the tracking URI explicitly (no process-global active run), so a step can talk to one
server without leaking state into another. The local default is `sqlite:////fsx/mlflow/mlflow.db`; the local
executor maps /fsx to a folder of the run.

Client retries are bounded (see `configure`): with a dead server a call fails in well under a minute instead of
MLflow's default of 7 retries, 120 s timeouts and backoff factor 2 (4 minutes of backoff alone, ~20 with timeouts).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from eksflow.errors import EXIT_FAILED
from eksflow.llm.steps.common.storage import exclusive
from eksflow.runtime.args import StepFailedError, StepInputError
from eksflow.runtime.shown import shown, url_setting_problem

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.entities.model_registry import ModelVersion

ADAPTER_ARTIFACT = (
    "adapter"  # eksflow.llm.steps.register logs the adapter folder under this artifact path of the version's run
)
MODEL_ARTIFACT = "model"  # ... and a whole model (a full fine-tune, or an adapter merged into its base) under this
KIND_TAG = "kind"  # a registered version's kind: adapter (LoRA on its base) or model (train.finetune=full)
METRIC_TAG_PREFIX = "metric."  # eksflow.llm.steps.register records each metric as tag metric.<name> on the version


def is_model(registered: ModelVersion) -> bool:
    """Whether a registered version is a whole model (tag kind=model), served by a vLLM fleet of its own."""
    return (registered.tags or {}).get(KIND_TAG) == "model"


def recorded_metrics(tags: Mapping[str, str]) -> dict[str, float]:
    """The metrics eksflow.llm.steps.register recorded as a version's tags (`metric.<name>`); other tags are skipped."""
    metrics = {}
    for tag, value in tags.items():
        if tag.startswith(METRIC_TAG_PREFIX):
            try:
                metrics[tag.removeprefix(METRIC_TAG_PREFIX)] = float(value)
            except ValueError:
                continue  # not a score register recorded: it cannot be compared
    return metrics


# 4 attempts x 10 s timeout + 1+2+4 s backoff ~ 47 s worst case against a hung server; a refused connection
# fails after ~7 s. Values already in the environment win, so an operator can widen them.
CLIENT_ENV_DEFAULTS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "3",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_BACKOFF_JITTER": "0.5",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",
    "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",  # a step's stderr ends with its one-line error, not a bar
}
SQLITE_PREFIX = "sqlite:///"

# After a failed log call, skip logging to that server for this long: retrying every call against a dead server
# would stall the training loop for the whole retry budget each time.
OUTAGE_SKIP_S = 60.0
_outage_since: dict[str, float] = {}  # tracking URI -> time.monotonic() of its last logging failure

MODEL_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._\-]{0,127}$"  # registered model names: safe in models:/ URIs and URLs

# What the registry answers for a missing model (RESOURCE_DOES_NOT_EXIST) or alias (INVALID_PARAMETER_VALUE).
NOT_FOUND_CODES = ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE")

# MLflow rejects longer tag values (the server's limit is 8000 characters; keep a margin).
MAX_TAG_CHARS = 5000

# Alias names (stages are deprecated in MLflow: aliases only).
ALIAS_ATTEMPTS = 3
CHALLENGER = "challenger"
CHAMPION = "champion"
PREVIOUS = "previous"

DATASET_DIGEST_TAG = "dataset_digest"  # lineage tag on a model version: the digest of the data it was trained on
# On every run a workflow starts: the workflow name, so its exit handler can find and end runs no output names.
WORKFLOW_TAG = "eksflow.workflow"


class TrackingError(StepFailedError):
    """MLflow failed (server down, store error); the message is one line. Retryable: the steps are idempotent."""

    label = "tracking error"
    exit_code = EXIT_FAILED


@contextmanager
def errors(tracking_uri: str, doing: str) -> Iterator[None]:
    """Turn any MLflow or HTTP failure inside the block into one TrackingError line naming the server."""
    import requests
    from mlflow.exceptions import MlflowException
    from sqlalchemy.exc import OperationalError

    try:
        yield
    except OperationalError as err:  # a sqlite store: raised by SQLAlchemy, unwrapped by MLflow
        raise database_error(tracking_uri, doing, err) from err
    except (MlflowException, requests.RequestException) as err:
        raise TrackingError(
            f"MLflow at {tracking_uri} failed while {doing}: {_first_line(err)}; check that the tracking server is "
            "up and reachable, then rerun (the step is idempotent)"
        ) from err


def database_error(tracking_uri: str, doing: str, err: BaseException) -> TrackingError:
    """One line for a failing sqlite store, naming its file; a lock held past SQLite's busy timeout says so."""
    where = sqlite_path(tracking_uri) or tracking_uri
    if "locked" in str(err):  # pysqlite waits 5 s for a lock before it gives up: that is the brief retry
        return TrackingError(
            f"MLflow database {where} is locked by another process (waited for it) while {doing}; rerun once "
            "that process (another run, an `mlflow ui` writing to it) is done"
        )
    return TrackingError(f"MLflow database {where} failed while {doing}: {_first_line(err)}")


def configure(tracking_uri: str) -> None:
    """Point MLflow's tracking and registry at `tracking_uri`, with bounded client retries and timeouts."""
    import mlflow

    if problem := url_setting_problem("tracking_uri", tracking_uri):  # the config refuses it; argv may still carry it
        raise StepInputError(f"--tracking-uri {problem}")
    for name, value in CLIENT_ENV_DEFAULTS.items():
        os.environ.setdefault(name, value)
    db = sqlite_path(tracking_uri)
    if db is not None:
        db.parent.mkdir(parents=True, exist_ok=True)
        _initialize_sqlite(tracking_uri, db)
    mlflow.set_tracking_uri(tracking_uri)
    mlflow.set_registry_uri(tracking_uri)


def _initialize_sqlite(tracking_uri: str, db: Path) -> None:
    """Create (or migrate) a sqlite store's tables once, under a lock.

    MLflow creates and migrates the schema when a process first opens the store; two processes doing it at once
    on a new file (two sweep candidates starting together) collide ("duplicate column name"). Whoever holds the
    lock does it; the others find the tables made.
    """
    from mlflow import MlflowClient
    from sqlalchemy.exc import OperationalError

    if tracking_uri in _initialized:
        return
    with exclusive(db.with_name(db.name + ".init-lock")):
        try:
            opened = MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)
            opened.search_experiments(max_results=1)
            opened.search_registered_models(max_results=1)
        except OperationalError as err:
            raise database_error(tracking_uri, "opening it", err) from err
    _initialized.add(tracking_uri)


_initialized: set[str] = set()  # sqlite stores this process has opened: their tables exist


def client(tracking_uri: str) -> MlflowClient:
    """An MlflowClient bound to `tracking_uri` for both tracking and registry (after `configure`)."""
    from mlflow import MlflowClient

    configure(tracking_uri)
    return MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)


def require_registry(tracking_uri: str) -> None:
    """Refuse a sqlite registry that does not exist (StepInputError), before anything would create it.

    A step that reads what earlier runs registered (a rollback, a check of the champion, serving a version) must not
    start an empty registry at a mistyped path and then report the version missing.
    """
    db = sqlite_path(tracking_uri)
    if db is not None and not db.is_file():
        raise StepInputError(
            f"--tracking-uri: no MLflow database at {db} ({tracking_uri}); check the path: this step reads what "
            "earlier runs registered there (`sqlite:////abs/path.db` is absolute, `sqlite:///rel.db` relative)"
        )


def sqlite_path(tracking_uri: str) -> Path | None:
    """The database file of a `sqlite:///` URI (`sqlite:////abs/path.db` is absolute), else None."""
    if not tracking_uri.startswith(SQLITE_PREFIX):
        return None
    return Path(tracking_uri.removeprefix(SQLITE_PREFIX))


def ensure_experiment(tracking_uri: str, name: str) -> str:
    """Return the id of experiment `name`, creating it if missing.

    With a sqlite backend the experiment's artifacts go to `<folder of the db>/artifacts`, never to ./mlruns of
    whatever directory the step happens to run in.
    """
    mlflow_client = client(tracking_uri)
    found = mlflow_client.get_experiment_by_name(name)
    if found is not None:
        return str(found.experiment_id)
    db = sqlite_path(tracking_uri)
    artifact_location = (db.parent.resolve() / "artifacts").as_uri() if db is not None else None
    from mlflow.exceptions import MlflowException

    try:
        return str(mlflow_client.create_experiment(name, artifact_location=artifact_location))
    except MlflowException:
        # Two steps may create it at once; the loser reads the winner's id.
        found = mlflow_client.get_experiment_by_name(name)
        if found is None:
            raise
        return str(found.experiment_id)


def ui_base(tracking_uri: str, ui_url: str) -> str:
    """Where links point: `ui_url` (what a browser reaches), else an http(s) tracking URI; empty for sqlite."""
    if ui_url:
        return ui_url.rstrip("/")
    return tracking_uri.rstrip("/") if tracking_uri.startswith(("http://", "https://")) else ""


def run_url(tracking_uri: str, ui_url: str, run_id: str) -> str:
    """The MLflow UI page of `run_id`, or "" when there is no UI address or the run cannot be read."""
    import requests
    from mlflow.exceptions import MlflowException

    base = ui_base(tracking_uri, ui_url)
    if not base or not run_id:
        return ""
    try:
        experiment_id = client(tracking_uri).get_run(run_id).info.experiment_id
    except (MlflowException, requests.RequestException) as err:  # a link is a convenience: never fail a step for it
        _warn(f"looking up run {run_id} for its link", err)
        return ""
    return f"{base}/#/experiments/{experiment_id}/runs/{run_id}"


def model_version_url(tracking_uri: str, ui_url: str, model_name: str, version: str) -> str:
    """The MLflow UI page of a registered model version, or "" when there is no UI address."""
    base = ui_base(tracking_uri, ui_url)
    return f"{base}/#/models/{model_name}/versions/{version}" if base else ""


def start_run(tracking_uri: str, experiment: str, run_name: str, tags: Mapping[str, str]) -> str:
    """Create a run in experiment `experiment` (by name, created if missing) and return its id."""
    experiment_id = ensure_experiment(tracking_uri, experiment)
    run = client(tracking_uri).create_run(experiment_id, run_name=run_name, tags=dict(tags))
    return str(run.info.run_id)


def log_metrics(tracking_uri: str, run_id: str, metrics: Mapping[str, float], step: int | None = None) -> bool:
    """Log metrics to a run. Never raises: an MLflow outage must not crash training (warns, returns False)."""

    def log() -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(key, float(value), now, step or 0) for key, value in metrics.items()]
        client(tracking_uri).log_batch(run_id, metrics=batch, synchronous=True)

    return _best_effort(tracking_uri, "metrics", metrics, log, f"log metrics {sorted(metrics)} to MLflow run {run_id}")


def log_params(tracking_uri: str, run_id: str, params: Mapping[str, object]) -> bool:
    """Log params to a run. Never raises (warns on stderr, returns False)."""

    def log() -> None:
        from mlflow.entities import Param

        batch = [Param(key, str(value)) for key, value in params.items()]
        client(tracking_uri).log_batch(run_id, params=batch, synchronous=True)

    return _best_effort(tracking_uri, "params", params, log, f"log params {sorted(params)} to MLflow run {run_id}")


def set_tags(tracking_uri: str, run_id: str, tags: Mapping[str, str]) -> bool:
    """Set tags on a run (over-long values are cut). Never raises (warns on stderr, returns False)."""

    def log() -> None:
        from mlflow.entities import RunTag

        batch = [RunTag(key, str(value)[:MAX_TAG_CHARS]) for key, value in tags.items()]
        client(tracking_uri).log_batch(run_id, tags=batch, synchronous=True)

    return _best_effort(tracking_uri, "tags", tags, log, f"set tags {sorted(tags)} on MLflow run {run_id}")


def log_files(tracking_uri: str, run_id: str, paths: Sequence[Path], artifact_path: str) -> bool:
    """Upload files into the run's artifact folder `artifact_path`. Never raises (warns, returns False)."""
    names = {p.name: p for p in paths}

    def log() -> None:
        mlflow_client = client(tracking_uri)
        for path in paths:
            mlflow_client.log_artifact(run_id, str(path), artifact_path)

    return _best_effort(tracking_uri, "artifacts", names, log, f"log {sorted(names)} to MLflow run {run_id}")


def _best_effort(
    tracking_uri: str, kind: str, names: Mapping[str, object], log: Callable[[], None], doing: str
) -> bool:
    """Run `log` unless the server is in a recent outage; on failure warn once, note the outage, return False."""
    if _in_outage(tracking_uri, kind, names):
        return False
    try:
        log()
    except Exception as err:  # any tracking failure is non-fatal by contract
        _note_failure(tracking_uri, err)
        _warn(f"could not {doing} at {tracking_uri}", err)
        return False
    _outage_since.pop(tracking_uri, None)
    return True


def alias_version(tracking_uri: str, model_name: str, alias: str) -> ModelVersion | None:
    """The version of `model_name` holding `alias`, or None when the model or the alias does not exist.

    Raises TrackingError when the registry cannot answer: a caller gating on the answer must not guess.
    """
    from mlflow.exceptions import MlflowException

    with errors(tracking_uri, f"looking up alias {alias!r} of model {model_name!r}"):
        try:
            return client(tracking_uri).get_model_version_by_alias(model_name, alias)
        except MlflowException as err:
            if err.error_code not in NOT_FOUND_CODES:
                raise
            return None


def set_alias(mlflow_client: MlflowClient, model_name: str, alias: str, version: str) -> None:
    """Point `alias` at `version`, retrying MLflow's check-then-insert race.

    Two concurrent writers of the same new alias can both find it missing and both insert it; the server answers
    the loser with a UNIQUE constraint error although the alias now exists. Setting it again updates the row.
    """
    from mlflow.exceptions import MlflowException

    for attempt in range(ALIAS_ATTEMPTS):
        try:
            mlflow_client.set_registered_model_alias(model_name, alias, str(version))
            return
        except MlflowException as err:
            if "UNIQUE constraint" not in str(err) or attempt == ALIAS_ATTEMPTS - 1:
                raise
            time.sleep(0.2 * (attempt + 1))


def promote(tracking_uri: str, model_name: str, version: str) -> str:
    """Point alias `champion` at `version`; the former champion (if another version) gets alias `previous`.

    Returns the new champion version. Alias moves are last-writer-wins in MLflow: eksflow.llm.steps.promote compares the
    alias with the champion it expects first, and reads it back after (RO4).
    """
    from mlflow.exceptions import MlflowException

    mlflow_client = client(tracking_uri)
    try:
        former: str | None = str(mlflow_client.get_model_version_by_alias(model_name, CHAMPION).version)
    except MlflowException as err:
        if err.error_code not in NOT_FOUND_CODES:
            raise
        former = None  # no champion yet
    if former is not None and former != str(version):
        set_alias(mlflow_client, model_name, PREVIOUS, former)
    set_alias(mlflow_client, model_name, CHAMPION, str(version))
    return str(version)


def _note_failure(tracking_uri: str, err: Exception) -> None:
    """Start skipping on server-side or transport failures, not on a rejected request (4xx: e.g. a changed param)."""
    from mlflow.exceptions import ERROR_CODE_TO_HTTP_STATUS, MlflowException

    if not isinstance(err, MlflowException) or ERROR_CODE_TO_HTTP_STATUS.get(err.error_code, 500) >= 500:
        _outage_since[tracking_uri] = time.monotonic()


def _in_outage(tracking_uri: str, what: str, names: Mapping[str, object]) -> bool:
    """True (after one warning line) while a recent logging failure says the server is down."""
    since = _outage_since.get(tracking_uri)
    if since is None or time.monotonic() - since >= OUTAGE_SKIP_S:
        return False
    print(
        f"warning: skipped logging {what} {sorted(names)}: MLflow at {tracking_uri} failed "
        f"{time.monotonic() - since:.0f} s ago (next attempt after {OUTAGE_SKIP_S:.0f} s)",
        file=sys.stderr,
        flush=True,
    )
    return True


def _first_line(err: BaseException) -> str:
    return f"{type(err).__name__}: " + (str(err).strip().splitlines() or [""])[0][:300]


def _warn(what: str, err: BaseException) -> None:
    print(shown(f"warning: {what}: {_first_line(err)}"), file=sys.stderr, flush=True)
