"""The registry at scale against a real `mlflow server` (sqlite backend, local artifact root) on 127.0.0.1.

docs/reliability.md ML1 (repeated registration -> one version), concurrent registrations of distinct checkpoints ->
distinct versions, ML2 (server killed during registration -> bounded clear failure, rerun without duplicate) and
ML3 (aliases only; champion moves only through promote, the former champion keeps `previous`).

The base+adapter merge is replaced by a copy of the adapter folder: what is under test is the registry protocol,
and the real merge is covered by tests/unit/steps/test_register.py. Adapters are a few random bytes each.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from eksflow.llm.steps import champion as champion_step
from eksflow.llm.steps import load_candidate, register
from eksflow.llm.steps.common import rollout, tracking
from eksflow.llm.steps.common.base_model import DEMO_MODEL
from eksflow.llm.steps.evaluate import gate as evaluate_gate
from eksflow.llm.steps.evaluate import step as evaluate_step

pytestmark = pytest.mark.slow

STARTUP_TIMEOUT_S = 120
STAGE_METHODS = ("transition_model_version_stage", "get_latest_versions")
EVAL_SET = "sha256:" + "5" * 64


class MlflowServer:
    """`mlflow server` on a fixed port, so it can be killed and started again at the same URI."""

    def __init__(self, root: Path) -> None:
        self.root = root
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = int(s.getsockname()[1])
        self.uri = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        log = open(self.root / "server.log", "ab")  # noqa: SIM115 - the server process owns it
        self.proc = subprocess.Popen(
            [
                str(Path(sys.executable).with_name("mlflow")),
                "server",
                f"--backend-store-uri=sqlite:///{self.root}/mlflow.db",
                f"--default-artifact-root={(self.root / 'artifacts').as_uri()}",
                "--host=127.0.0.1",
                f"--port={self.port}",
                "--workers=1",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},  # no job runner: faster start/stop
            start_new_session=True,  # its own process group: kill() takes the uvicorn worker with it
        )
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError((self.root / "server.log").read_text()[-2000:])
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                time.sleep(0.3)
        self.kill()
        raise RuntimeError(f"mlflow server on port {self.port} did not start within {STARTUP_TIMEOUT_S} s")

    def kill(self) -> None:
        """SIGKILL the whole process group: an outage, not a shutdown."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self.proc = None


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[MlflowServer]:
    srv = MlflowServer(tmp_path_factory.mktemp("mlflow-server"))
    srv.start()
    try:
        yield srv
    finally:
        srv.kill()


@pytest.fixture(autouse=True)
def registry_only(monkeypatch, server):
    """Copy instead of merge, forbid the stage API, and make sure the server is up when a test starts."""

    def copy_adapter(_base: Path, adapter_dir: Path, merged_dir: Path) -> None:
        shutil.rmtree(merged_dir, ignore_errors=True)
        shutil.copytree(adapter_dir, merged_dir)

    def forbidden(*_args, **_kwargs):
        raise AssertionError("the MLflow stage API was called; use aliases")

    from mlflow import MlflowClient

    monkeypatch.setattr(register, "merge_adapter", copy_adapter)
    monkeypatch.setattr(register, "resolve_model", lambda name, _cache: Path(name))
    for name in STAGE_METHODS:
        monkeypatch.setattr(MlflowClient, name, forbidden)
    if server.proc is None:  # a previous test killed it and failed before restarting
        server.start()


def fake_adapter(folder: Path, seed: int) -> Path:
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text(json.dumps({"r": 4, "seed": seed}))
    (folder / "adapter_model.safetensors").write_bytes(os.urandom(2048))
    return folder


def gate_report(folder: Path) -> Path:
    path = folder / "eval_report.json"
    path.write_text(
        json.dumps(
            {
                "passed": True,
                "reason": "all thresholds met: exact_match >= 0.6; no champion yet: thresholds only",
                "thresholds": [{"metric": "exact_match", "op": ">=", "value": 0.6, "actual": 0.9}],
                "eval_set_digest": EVAL_SET,
            }
        )
    )
    return path


def args(tmp_path: Path, adapter: Path, uri: str, model: str, **extra: object) -> register.Args:
    values = {
        "model_name": model,
        "adapter_dir": adapter,
        "base_model": DEMO_MODEL,
        "metrics": {"exact_match": 0.9, "eval_loss": 0.25},
        "dataset_digest": "sha256:" + "d" * 64,
        "dataset_uri": "s3://eksflow-data/dates/v1",
        "workflow_name": "llama-lora-x7k2p",
        "workflow_uid": "6f1c2a9e-0d51-4c1e-9a55-3a8f6f2b1c07",
        "config_hash": "sha256:" + "c" * 64,
        "git_commit": "0123abcd",
        "image": "ghcr.io/eksflow/steps@sha256:" + "e" * 64,
        "eval_report": gate_report(tmp_path),
        "merged_dir": tmp_path / f"merged-{adapter.name}",
        "tracking_uri": uri,
        "outputs_dir": tmp_path / "outputs",
        **extra,
    }
    return register.Args.model_validate(values)


def versions(uri: str, model: str) -> list[str]:
    return sorted(str(v.version) for v in tracking.client(uri).search_model_versions(f"name = '{model}'"))


def alias(uri: str, model: str, name: str) -> str | None:
    found = tracking.alias_version(uri, model, name)
    return None if found is None else str(found.version)


def test_ten_registrations_of_one_checkpoint_make_one_version_with_full_lineage(tmp_path, server):
    adapter = fake_adapter(tmp_path / "a", seed=1)
    # The first registration predates the eval report: a rerun adds the lineage it lacked, never a version.
    first = register.run(args(tmp_path, adapter, server.uri, "ml1", eval_report=None, workflow_uid=""))
    results = [first, *(register.run(args(tmp_path, adapter, server.uri, "ml1")) for _ in range(9))]

    assert {r.model_version for r in results} == {"1"}
    assert versions(server.uri, "ml1") == ["1"]  # 10 registrations, 0 duplicates
    tags = tracking.client(server.uri).get_model_version("ml1", "1").tags
    assert tags == {
        "checkpoint_digest": register.checkpoint_digest(adapter),
        "dataset_digest": "sha256:" + "d" * 64,
        "dataset_uri": "s3://eksflow-data/dates/v1",
        "workflow_name": "llama-lora-x7k2p",
        "workflow_uid": "6f1c2a9e-0d51-4c1e-9a55-3a8f6f2b1c07",
        "base_model": DEMO_MODEL,
        "config_hash": "sha256:" + "c" * 64,
        "git_commit": "0123abcd",
        "image": "ghcr.io/eksflow/steps@sha256:" + "e" * 64,
        "eval_set_digest": EVAL_SET,
        "metric.eval_loss": "0.25",
        "metric.exact_match": "0.9",
        "gate.decision": "passed",
        "gate.reason": "all thresholds met: exact_match >= 0.6; no champion yet: thresholds only",
        "gate.thresholds": '["exact_match >= 0.6"]',
        # what the adapter is, from its adapter_config.json (empty target_modules: the fake's config names none)
        "lora.rank": "4",
        "lora.use_dora": "false",
        "lora.quantize": "none",
        "kind": "adapter",
    }


def test_concurrent_registrations_of_distinct_checkpoints_get_distinct_versions(tmp_path, server):
    adapters = [fake_adapter(tmp_path / f"c{i}", seed=i) for i in range(5)]
    prepared = [args(tmp_path, a, server.uri, "concurrent") for a in adapters]
    with ThreadPoolExecutor(max_workers=5) as pool:
        results = list(pool.map(register.run, prepared))

    assert sorted(int(r.model_version) for r in results) == [1, 2, 3, 4, 5]
    assert versions(server.uri, "concurrent") == ["1", "2", "3", "4", "5"]
    client = tracking.client(server.uri)
    for adapter, result in zip(adapters, results, strict=True):
        version = client.get_model_version("concurrent", result.model_version)
        assert version.tags["checkpoint_digest"] == register.checkpoint_digest(adapter)


def test_concurrent_registrations_of_one_checkpoint_leave_one_version(tmp_path, server):
    adapter = fake_adapter(tmp_path / "same", seed=9)
    prepared = [args(tmp_path, adapter, server.uri, "same", merged_dir=tmp_path / f"merged-{i}") for i in range(3)]
    with ThreadPoolExecutor(max_workers=3) as pool:
        results = list(pool.map(register.run, prepared))

    assert {r.model_version for r in results} == {"1"}
    assert versions(server.uri, "same") == ["1"]


@pytest.mark.parametrize("when", ["before-create", "after-create"])
def test_server_killed_during_registration_fails_clearly_and_rerun_makes_no_duplicate(
    tmp_path, server, monkeypatch, when
):
    model = f"ml2-{when}"
    adapter = fake_adapter(tmp_path / "a", seed=3)
    create = register.create_version

    def outage(*a, **kw):  # the server dies mid-registration: artifacts logged, version not yet (or just) created
        if when == "after-create":
            version = create(*a, **kw)
            server.kill()
            return version
        server.kill()
        return create(*a, **kw)

    monkeypatch.setattr(register, "create_version", outage)
    with pytest.raises(tracking.TrackingError) as failed:
        register.run(args(tmp_path, adapter, server.uri, model))
    message = str(failed.value)
    assert message.startswith(f"MLflow at {server.uri} failed while registering the model")
    assert "\n" not in message and "rerun" in message

    monkeypatch.setattr(register, "create_version", create)
    server.start()
    rerun = register.run(args(tmp_path, adapter, server.uri, model))

    assert versions(server.uri, model) == ["1"]
    assert rerun.model_version == "1"
    assert alias(server.uri, model, tracking.CHALLENGER) == "1"


def test_aliases_only_and_champion_moves_only_on_promote(tmp_path, server):
    model = "ml3"
    first = register.run(args(tmp_path, fake_adapter(tmp_path / "a", seed=4), server.uri, model))
    assert (alias(server.uri, model, "challenger"), alias(server.uri, model, "champion")) == ("1", None)
    no_champion = champion_step.Args(model_name=model, tracking_uri=server.uri, outputs_dir=tmp_path / "c")
    assert champion_step.run(no_champion).version == ""  # registered is not champion: judged by thresholds only

    tracking.promote(server.uri, model, first.model_version)  # what deploy does after a passing smoke test
    second = register.run(args(tmp_path, fake_adapter(tmp_path / "b", seed=5), server.uri, model))
    assert (alias(server.uri, model, "challenger"), alias(server.uri, model, "champion")) == ("2", "1")
    assert alias(server.uri, model, "previous") is None

    tracking.promote(server.uri, model, second.model_version)
    assert (alias(server.uri, model, "champion"), alias(server.uri, model, "previous")) == ("2", "1")
    for version in versions(server.uri, model):
        assert tracking.client(server.uri).get_model_version(model, version).current_stage in ("None", None)

    # The next run's champion step reads v2 (retrain=always too), and its evaluation compares with what v2
    # recorded, on the same eval set; a tie is not a win.
    read = champion_step.run(champion_step.Args(model_name=model, tracking_uri=server.uri, outputs_dir=tmp_path / "c"))
    assert read == champion_step.Outputs(version="2", dataset_digest="")
    champion = evaluate_step.find_champion(server.uri, model, read.version)
    assert champion == evaluate_gate.Champion(
        version="2", eval_set_digest=EVAL_SET, scores={"exact_match": 0.9, "eval_loss": 0.25}
    )
    check = evaluate_gate.champion_gate({"exact_match": 0.92}, champion, EVAL_SET, "exact_match", 0.05)
    assert not check.passed and check.required == pytest.approx(0.95)
    assert not evaluate_gate.champion_gate({"exact_match": 0.9}, champion, EVAL_SET, "exact_match", 0).passed


def test_a_version_registered_before_the_champion_is_never_rolled_out_over_it(tmp_path, server, capsys):
    """v1 promoted, then v2; a rerun that trains v1's weights again (train memoized) registers v1 again: the
    rollout refuses it in one line naming both versions, before any server of the fleet is asked."""
    model = "older"
    first = fake_adapter(tmp_path / "a", seed=6)
    for adapter in (first, fake_adapter(tmp_path / "b", seed=7)):
        tracking.promote(server.uri, model, register.run(args(tmp_path, adapter, server.uri, model)).model_version)
    again = register.run(args(tmp_path, first, server.uri, model))
    assert again.model_version == "1"
    with socket.socket() as s:  # a port nothing listens on: a step that asked the fleet would fail otherwise
        s.bind(("127.0.0.1", 0))
        nobody = f"http://127.0.0.1:{s.getsockname()[1]}"
    serving = rollout.RolloutState(champion_version="2", champion_slot="blue", stage="serve-champion")
    rollout.write_state(tmp_path / "state.json", serving)  # serve-champion found v2 serving
    argv = [f"--model-name={model}", f"--model-version={again.model_version}", "--evaluated-champion=2",
            f"--tracking-uri={server.uri}", f"--vllm-url={nobody}", f"--proxy-url={nobody}",
            f"--serving-dir={tmp_path / 'adapters'}", f"--routes-file={tmp_path / 'routes.json'}",
            f"--state-file={tmp_path / 'state.json'}", f"--base-model={DEMO_MODEL}", f"--base-dir={tmp_path}",
            f"--outputs-dir={tmp_path / 'load-out'}"]  # fmt: skip
    capsys.readouterr()  # register's lines
    assert load_candidate.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert f"{model} v1 was registered before the champion v2" in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "adapters").exists()
    assert (alias(server.uri, model, "champion"), alias(server.uri, model, "previous")) == ("2", "1")


def test_a_local_runs_preflight_finds_the_tracking_server_and_its_registry_up_then_down(server):
    """MlflowSettings.local_problems asks the REST API what the steps will (issue 55: found only after training)."""
    from eksflow.llm.pipeline import MlflowSettings

    settings = MlflowSettings(tracking_uri=server.uri)
    assert settings.local_problems() == []
    server.kill()
    try:
        (line,) = settings.local_problems()  # refused, or reset by what the killed server left: the system's words
        assert line.startswith(f"tracking_uri: MLflow at {server.uri} cannot be reached (connection re"), line
        assert line.endswith("); start its server or fix the URI"), line
    finally:
        server.start()
