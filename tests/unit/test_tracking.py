import os
import socket
from pathlib import Path

import pytest

from eksflow.llm.steps.common import tracking


def sqlite_uri(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/mlflow/mlflow.db"


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> tuple[str, Path]:
    """One sqlite store for the module: creating its tables takes seconds. Tests use distinct names in it."""
    folder = tmp_path_factory.mktemp("store")
    return sqlite_uri(folder), folder


def dead_uri() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"  # closed again: nothing listens there


@pytest.fixture
def no_retries(monkeypatch):
    """A dead server fails on the first attempt (the default budget is ~10 s; not needed to test the contract)."""
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")


def test_configure_bounds_retries_but_keeps_operator_values(tmp_path, monkeypatch):
    for name in tracking.CLIENT_ENV_DEFAULTS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "33")
    tracking.configure(sqlite_uri(tmp_path))
    assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "3"
    assert os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "33"
    assert (tmp_path / "mlflow").is_dir()


@pytest.mark.parametrize(
    ("uri", "path"),
    [
        ("sqlite:////fsx/mlflow/mlflow.db", Path("/fsx/mlflow/mlflow.db")),
        ("sqlite:///mlflow.db", Path("mlflow.db")),
        ("http://mlflow:5000", None),
    ],
    ids=["absolute", "relative", "http"],
)
def test_sqlite_path(uri, path):
    assert tracking.sqlite_path(uri) == path


def test_experiment_artifacts_live_next_to_the_sqlite_db(store):
    uri, folder = store
    experiment_id = tracking.ensure_experiment(uri, "artifacts-here")
    assert tracking.ensure_experiment(uri, "artifacts-here") == experiment_id
    experiment = tracking.client(uri).get_experiment(experiment_id)
    assert experiment.artifact_location == (folder / "mlflow" / "artifacts").as_uri()


def test_run_metrics_and_params(store):
    uri, _ = store
    run_id = tracking.start_run(uri, "runs", "train-1", {"workflow_name": "wf-1"})
    assert tracking.log_metrics(uri, run_id, {"loss": 2.5}, step=1)
    assert tracking.log_metrics(uri, run_id, {"loss": 1.5}, step=2)
    assert tracking.log_params(uri, run_id, {"lr": 0.001, "rank": 8})
    client = tracking.client(uri)
    run = client.get_run(run_id)
    assert run.info.run_name == "train-1"
    assert run.data.tags["workflow_name"] == "wf-1"
    assert run.data.params == {"lr": "0.001", "rank": "8"}
    history = client.get_metric_history(run_id, "loss")
    assert [(m.step, m.value) for m in history] == [(1, 2.5), (2, 1.5)]


def test_logging_never_raises(no_retries, capsys):
    uri = dead_uri()
    assert tracking.log_metrics(uri, "0" * 32, {"loss": 1.0}, step=3) is False
    assert tracking.log_params(uri, "0" * 32, {"lr": 0.1}) is False
    lines = capsys.readouterr().err.strip().splitlines()
    warnings = [line for line in lines if line.startswith("warning: ")]
    assert len(warnings) == 2
    assert f"could not log metrics ['loss'] to MLflow run {'0' * 32} at {uri}" in warnings[0]
    # The server just failed: the next call is skipped at once instead of spending the retry budget again.
    assert f"skipped logging params ['lr']: MLflow at {uri} failed" in warnings[1]


def test_rejected_param_is_not_an_outage(store):
    uri, _ = store
    run_id = tracking.start_run(uri, "rejected", "r", {})
    assert tracking.log_params(uri, run_id, {"lr": 0.1})
    assert tracking.log_params(uri, run_id, {"lr": 0.2}) is False  # MLflow params are immutable
    assert tracking.log_metrics(uri, run_id, {"loss": 1.0})


def test_errors_turn_outages_into_one_line(no_retries):
    uri = dead_uri()
    with pytest.raises(tracking.TrackingError) as caught, tracking.errors(uri, "listing models"):
        tracking.client(uri).search_registered_models()
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"MLflow at {uri} failed while listing models: MlflowException: ")


def test_promote_keeps_the_former_champion_as_previous(store):
    uri, _ = store
    run_id = tracking.start_run(uri, "promote", "r", {})
    client = tracking.client(uri)
    client.create_registered_model("m")
    source = f"{client.get_run(run_id).info.artifact_uri}/model"
    for _ in range(3):
        client.create_model_version("m", source, run_id=run_id)

    def aliases() -> dict[str, str]:
        return {alias: str(version) for alias, version in client.get_registered_model("m").aliases.items()}

    assert tracking.promote(uri, "m", "1") == "1"
    assert aliases() == {"champion": "1"}
    tracking.promote(uri, "m", "2")
    assert aliases() == {"champion": "2", "previous": "1"}
    tracking.promote(uri, "m", "2")  # a rerun of the same deploy keeps the real predecessor
    assert aliases() == {"champion": "2", "previous": "1"}
    tracking.promote(uri, "m", "3")
    assert aliases() == {"champion": "3", "previous": "2"}


def test_tags_and_files_on_a_run(store, tmp_path):
    uri, _ = store
    run_id = tracking.start_run(uri, "tags", "r", {})
    assert tracking.set_tags(uri, run_id, {"gate.decision": "passed", "gate.reason": "x" * 9000})
    (tmp_path / "eval_report.md").write_text("| metric |\n")
    assert tracking.log_files(uri, run_id, [tmp_path / "eval_report.md"], "eval")
    client = tracking.client(uri)
    tags = client.get_run(run_id).data.tags
    assert tags["gate.decision"] == "passed"
    assert len(tags["gate.reason"]) == tracking.MAX_TAG_CHARS  # cut, not rejected
    assert [a.path for a in client.list_artifacts(run_id, "eval")] == ["eval/eval_report.md"]


def test_alias_version_is_none_for_a_missing_model_or_alias(store):
    uri, _ = store
    assert tracking.alias_version(uri, "no-such-model", tracking.CHAMPION) is None
    tracking.client(uri).create_registered_model("no-alias")
    assert tracking.alias_version(uri, "no-alias", tracking.CHAMPION) is None


def test_alias_lookup_fails_closed_when_the_registry_is_down(no_retries):
    uri = dead_uri()
    with pytest.raises(tracking.TrackingError, match=f"MLflow at {uri} failed while looking up alias 'champion'"):
        tracking.alias_version(uri, "m", tracking.CHAMPION)


class _RacingRegistry:
    """A registry whose first alias insert loses MLflow's check-then-insert race, as a concurrent writer's does."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.aliases: dict[str, str] = {}

    def set_registered_model_alias(self, name: str, alias: str, version: str) -> None:
        from mlflow.exceptions import MlflowException

        if self.failures:
            self.failures -= 1
            raise MlflowException("(sqlite3.IntegrityError) UNIQUE constraint failed: registered_model_aliases.alias")
        self.aliases[alias] = version


def test_set_alias_retries_the_unique_constraint_race() -> None:
    registry = _RacingRegistry(failures=1)
    tracking.set_alias(registry, "m", tracking.CHALLENGER, "3")  # type: ignore[arg-type]
    assert registry.aliases == {tracking.CHALLENGER: "3"}


def test_set_alias_gives_up_after_bounded_attempts() -> None:
    from mlflow.exceptions import MlflowException

    with pytest.raises(MlflowException, match="UNIQUE constraint"):
        tracking.set_alias(_RacingRegistry(failures=tracking.ALIAS_ATTEMPTS), "m", "champion", "1")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("tracking_uri", "ui_url", "base"),
    [
        ("http://mlflow.mlflow.svc:5000/", "", "http://mlflow.mlflow.svc:5000"),
        ("http://mlflow.mlflow.svc:5000", "https://mlflow.example.com/", "https://mlflow.example.com"),
        ("sqlite:////fsx/mlflow/mlflow.db", "", ""),
        ("sqlite:////fsx/mlflow/mlflow.db", "http://127.0.0.1:5000", "http://127.0.0.1:5000"),
    ],
)
def test_links_point_at_the_address_a_browser_reaches(tracking_uri, ui_url, base):
    assert tracking.ui_base(tracking_uri, ui_url) == base
    expected = f"{base}/#/models/llama-lora/versions/3" if base else ""
    assert tracking.model_version_url(tracking_uri, ui_url, "llama-lora", "3") == expected


def test_run_url_names_the_runs_experiment(store):
    uri, _ = store
    run_id = tracking.start_run(uri, "links", "run", {})
    experiment_id = tracking.ensure_experiment(uri, "links")
    ui = "http://127.0.0.1:5000"
    assert tracking.run_url(uri, ui, run_id) == f"{ui}/#/experiments/{experiment_id}/runs/{run_id}"
    assert tracking.run_url(uri, "", run_id) == ""  # sqlite and no UI address: no link rather than a wrong one


def test_run_url_is_empty_when_the_server_is_down(no_retries, capsys):
    assert tracking.run_url(dead_uri(), "", "0123") == ""
    assert "warning: looking up run 0123" in capsys.readouterr().err


@pytest.mark.slow
def test_processes_opening_a_new_sqlite_store_together_all_succeed(tmp_path):
    """Two sweep candidates start at once on a fresh store: MLflow's schema creation must not collide."""
    import subprocess
    import sys

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    code = "import sys; from eksflow.llm.steps.common import tracking; tracking.ensure_experiment(sys.argv[1], 'x')"
    procs = [subprocess.Popen([sys.executable, "-c", code, uri], stderr=subprocess.PIPE, text=True) for _ in range(3)]
    for proc in procs:
        _, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 0, stderr


@pytest.mark.parametrize("uri", ["https://admin:hunter22@mlflow:5000", "https://mlflow:5000/?access_token=hunter22"])
def test_a_credential_in_the_tracking_uri_is_bad_input_without_echoing_it(uri):
    with pytest.raises(tracking.StepInputError, match="MLFLOW_TRACKING_TOKEN") as refused:
        tracking.configure(uri)  # the config refuses it; a step given it in argv refuses it too, before MLflow sees it
    assert "hunter22" not in str(refused.value)
