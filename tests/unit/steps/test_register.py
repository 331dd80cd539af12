import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eksflow.llm.steps import register
from eksflow.llm.steps.common import tracking
from eksflow.llm.steps.common.base_model import DEMO_MODEL, default_cache_dir, resolve_model
from eksflow.runtime.args import StepInputError
from eksflow.runtime.ports import free_port

METRICS = {"score": 0.8125, "loss": 1.25}
STAGE_METHODS = ("transition_model_version_stage", "get_latest_versions")
STEP_ENV = {**os.environ, "PYTHONPATH": str(Path(register.__file__).resolve().parents[1])}


@pytest.fixture(scope="session")
def base_model_dir() -> Path:
    return resolve_model(DEMO_MODEL, default_cache_dir())


def make_adapter(base_dir: Path, out: Path, seed: int) -> Path:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(base_dir)
    peft_model = get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    peft_model.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def adapters(base_model_dir, tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("adapters")
    return make_adapter(base_model_dir, root / "a", seed=1), make_adapter(base_model_dir, root / "b", seed=2)


@pytest.fixture
def no_stage_api(monkeypatch):
    """Fail the test if anything calls MLflow's deprecated stage API."""
    from mlflow import MlflowClient

    def forbidden(*_args, **_kwargs):
        raise AssertionError("the MLflow stage API was called; use aliases")

    for name in STAGE_METHODS:
        monkeypatch.setattr(MlflowClient, name, forbidden)


def register_args(tmp_path: Path, adapter: Path, tracking_uri: str, **extra) -> register.Args:
    values = {
        "adapter_dir": adapter,
        "base_model": DEMO_MODEL,
        "model_cache_dir": default_cache_dir(),
        "metrics": METRICS,
        "dataset_digest": "sha256:" + "d" * 64,
        "workflow_name": "llama-lora-abc12",
        "merged_dir": tmp_path / "merged",
        "tracking_uri": tracking_uri,
        "outputs_dir": tmp_path / "outputs",
        **extra,
    }
    return register.Args.model_validate(values)


def test_checkpoint_digest_covers_adapter_files_only(tmp_path):
    (tmp_path / "adapter_config.json").write_text("{}")
    (tmp_path / "adapter_model.safetensors").write_bytes(b"weights")
    first = register.checkpoint_digest(tmp_path)
    (tmp_path / "README.md").write_text(f"saved at {time.time()}")
    assert register.checkpoint_digest(tmp_path) == first
    (tmp_path / "adapter_model.safetensors").write_bytes(b"other weights")
    assert register.checkpoint_digest(tmp_path) != first


@pytest.mark.parametrize(
    ("metrics", "message"),
    [({}, "--metrics is empty"), ({"score": float("nan")}, "non-finite values for ['score']")],
    ids=["empty", "nan"],
)
def test_bad_metrics_never_register(tmp_path, metrics, message):
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    args = register_args(tmp_path, adapter, f"sqlite:///{tmp_path}/mlflow.db", metrics=metrics)
    with pytest.raises(StepInputError, match=message.replace("[", r"\[").replace("]", r"\]")):
        register.run(args)


def test_missing_adapter_exits_2_naming_the_flag(tmp_path, capsys):
    argv = [
        f"--adapter-dir={tmp_path / 'nothing'}",
        f"--base-model={DEMO_MODEL}",
        f"--metrics={json.dumps(METRICS)}",
        "--dataset-digest=x",
        "--workflow-name=wf",
        f"--merged-dir={tmp_path / 'merged'}",
        f"--tracking-uri=sqlite:///{tmp_path}/mlflow.db",
        f"--outputs-dir={tmp_path / 'out'}",
    ]
    assert register.main(argv) == 2
    assert "--adapter-dir=" in capsys.readouterr().err


@pytest.mark.slow
def test_register_is_idempotent_and_tags_lineage(tmp_path, adapters, no_stage_api, monkeypatch):
    monkeypatch.setenv("EKSFLOW_GIT_COMMIT", "0123abc")
    monkeypatch.setenv("EKSFLOW_IMAGE", "steps@sha256:" + "e" * 64)
    uri = f"sqlite:///{tmp_path}/mlflow/mlflow.db"
    train_run = tracking.start_run(uri, "eksflow", "train", {"workflow_name": "llama-lora-abc12"})
    first, second = adapters

    results = [register.run(register_args(tmp_path, first, uri, mlflow_run_id=train_run)) for _ in range(3)]
    other = register.run(register_args(tmp_path, second, uri, mlflow_run_id=train_run))

    assert {r.model_version for r in results} == {"1"}
    assert results[0].model_uri == "models:/llama-lora/1"
    assert results[0].mlflow_run_id == train_run
    assert other.model_version == "2"
    client = tracking.client(uri)
    versions = client.search_model_versions("name = 'llama-lora'")
    assert sorted(str(v.version) for v in versions) == ["1", "2"]
    v1 = client.get_model_version("llama-lora", "1")
    assert v1.tags == {
        "checkpoint_digest": register.checkpoint_digest(first),
        "dataset_digest": "sha256:" + "d" * 64,
        "workflow_name": "llama-lora-abc12",
        "base_model": DEMO_MODEL,
        "metric.score": "0.8125",
        "metric.loss": "1.25",
        "git_commit": "0123abc",
        "image": "steps@sha256:" + "e" * 64,
        "lora.rank": "8",  # the adapter's kind, from its adapter_config.json
        "lora.target_modules": "q_proj,v_proj",
        "lora.use_dora": "false",
        "lora.quantize": "none",
        "kind": "adapter",  # served on its base; a full fine-tune's version is a model
    }
    assert v1.current_stage in ("None", None)
    assert v1.source.endswith("/adapter") and v1.run_id == train_run  # serving loads the adapter onto its base
    assert str(client.get_model_version_by_alias("llama-lora", "challenger").version) == "2"
    artifacts = {a.path for a in client.list_artifacts(train_run)}
    assert artifacts == {"adapter", "model"}
    assert {a.path for a in client.list_artifacts(train_run, "adapter")} >= {
        "adapter/adapter_config.json",
        "adapter/adapter_model.safetensors",
    }
    model_files = {Path(a.path).name for a in client.list_artifacts(train_run, "model")}
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= model_files
    # sqlite tracking keeps artifacts next to the database, never in ./mlruns of the working directory.
    assert v1.source.startswith((tmp_path / "mlflow" / "artifacts").as_uri())


def start_mlflow_server(root: Path, port: int) -> subprocess.Popen[bytes]:
    mlflow_cli = Path(sys.executable).with_name("mlflow")
    log = open(root / f"server-{port}.log", "ab")  # noqa: SIM115 - the server process owns it
    proc = subprocess.Popen(
        [
            str(mlflow_cli),
            "server",
            f"--backend-store-uri=sqlite:///{root}/mlflow.db",
            f"--default-artifact-root={(root / 'artifacts').as_uri()}",
            "--host=127.0.0.1",
            f"--port={port}",
            "--workers=1",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        # No job runner: the registry does not need it, and its 7 huey worker processes slow start and stop.
        env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
        start_new_session=True,  # its own process group: kill() takes the uvicorn worker with it
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError((root / f"server-{port}.log").read_text()[-2000:])
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return proc
        except OSError:
            time.sleep(0.5)
    kill(proc)
    raise RuntimeError(f"mlflow server on port {port} did not start within 120 s")


def kill(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the server's process group: an outage, not a shutdown (sqlite commits are atomic)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


@pytest.mark.slow
def test_register_over_http_survives_server_outage(tmp_path, adapters, no_stage_api):
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    server = start_mlflow_server(tmp_path, port)
    try:
        registered = register.run(register_args(tmp_path, adapters[0], uri))
        assert registered.model_version == "1"
        assert tracking.client(uri).get_run(registered.mlflow_run_id).data.metrics == METRICS
    finally:
        kill(server)

    argv = [
        f"--{name.replace('_', '-')}={value}"
        for name, value in {
            "adapter_dir": adapters[0],
            "base_model": DEMO_MODEL,
            "metrics": json.dumps(METRICS),
            "dataset_digest": "x",
            "workflow_name": "wf",
            "merged_dir": tmp_path / "merged",
            "tracking_uri": uri,
            "outputs_dir": tmp_path / "out",
        }.items()
    ]
    # The bound is the client's retry budget (tracking.CLIENT_ENV_DEFAULTS), far below MLflow's ~10 minutes.
    down = subprocess.run(
        [sys.executable, "-m", "eksflow.llm.steps.register", *argv],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        env=STEP_ENV,
    )
    assert down.returncode == 1
    assert "Traceback" not in down.stderr
    last = down.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: MLflow at {uri} failed while registering the model")
    assert "rerun" in last

    server = start_mlflow_server(tmp_path, port)
    try:
        assert register.main(argv) == 0
        assert (tmp_path / "out" / "model_version").read_text() == "1"
        versions = tracking.client(uri).search_model_versions("name = 'llama-lora'")
        assert [str(v.version) for v in versions] == ["1"]
    finally:
        kill(server)


def test_a_failed_gate_report_never_registers(tmp_path):
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    report = tmp_path / "eval_report.json"
    report.write_text(json.dumps({"passed": False, "reason": "exact_match = 0.1000 fails", "thresholds": []}))
    args = register_args(tmp_path, adapter, f"sqlite:///{tmp_path}/mlflow.db", eval_report=report)
    with pytest.raises(StepInputError, match="says the gate failed"):
        register.run(args)
