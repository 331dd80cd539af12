import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from steps import deploy, register
from steps.common import serving, tracking
from steps.common.base_model import DEMO_MODEL, default_cache_dir, resolve_model

MODEL = "smoke-demo"


@pytest.fixture(scope="session")
def base_model_dir() -> Path:
    return resolve_model(DEMO_MODEL, default_cache_dir())


@pytest.fixture
def registry(tmp_path, base_model_dir) -> str:
    """Two registered versions of MODEL, both the unmodified demo base model (a merge with a zero adapter)."""
    uri = f"sqlite:///{tmp_path}/mlflow/mlflow.db"
    run_id = tracking.start_run(uri, "eksflow", "train", {})
    client = tracking.client(uri)
    client.log_artifacts(run_id, str(base_model_dir), register.MODEL_ARTIFACT)
    for digest in ("a" * 64, "b" * 64):
        register.create_version(client, MODEL, run_id, {register.DIGEST_TAG: digest})
    return uri


def deploy_args(tmp_path: Path, uri: str, version: str, **settings) -> deploy.Args:
    return deploy.Args.model_validate(
        {
            "model_name": MODEL,
            "model_version": version,
            "tracking_uri": uri,
            "serve_dir": tmp_path / "serve",
            "outputs_dir": tmp_path / "outputs",
            **settings,
        }
    )


def alias_version(uri: str, alias: str) -> str:
    return str(tracking.client(uri).get_model_version_by_alias(MODEL, alias).version)


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.parametrize(
    ("answer", "expect", "passed"),
    [
        ("1976-07-04", "1976-07-04", True),
        ("The date is 1976-07-04.", "1976-07-04", True),
        ("July 4, 1976", "1976-07-04", False),
        ("anything", "", True),
        ("  ", "", False),
    ],
    ids=["exact", "contained", "wrong", "any", "blank"],
)
def test_smoke_passed(answer, expect, passed):
    assert deploy.smoke_passed(answer, expect) is passed


def test_unregistered_version_exits_2(tmp_path, capsys):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    argv = [f"--model-name={MODEL}", "--model-version=7", f"--tracking-uri={uri}", f"--serve-dir={tmp_path}"]
    assert deploy.main(argv) == 2
    assert "version 7 is not registered" in capsys.readouterr().err


@pytest.mark.slow
def test_deploy_serves_smoke_tests_and_promotes(tmp_path, registry):
    first = deploy.run(deploy_args(tmp_path, registry, "1", smoke_expect=""))
    assert first.answer
    assert first.champion_version == "1"
    assert first.endpoint.startswith("http://127.0.0.1:") and first.endpoint.endswith("/v1/chat/completions")

    port = serving.free_port()
    second = deploy.run(deploy_args(tmp_path, registry, "2", smoke_expect="", port=port))
    # temperature 0: the same weights give the same answer
    assert second.answer == first.answer
    assert second.endpoint == f"http://127.0.0.1:{port}/v1/chat/completions"
    assert (alias_version(registry, "champion"), alias_version(registry, "previous")) == ("2", "1")
    assert not listening(port)


@pytest.mark.slow
def test_failed_smoke_test_keeps_champion(tmp_path, registry, capsys):
    tracking.promote(registry, MODEL, "1")
    port = serving.free_port()
    argv = [
        f"--model-name={MODEL}",
        "--model-version=2",
        f"--tracking-uri={registry}",
        f"--serve-dir={tmp_path / 'serve'}",
        f"--outputs-dir={tmp_path / 'outputs'}",
        f"--port={port}",
        "--smoke-expect=no model answers this",
    ]
    assert deploy.main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"error: smoke test failed for {MODEL} version 2")
    assert "champion not moved" in err[-1]
    assert alias_version(registry, "champion") == "1"
    assert not listening(port)
    assert not (tmp_path / "outputs" / "champion_version").exists()


@pytest.mark.slow
def test_server_that_dies_fails_with_its_log(tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "no-such-architecture"}')
    server = serving.model_server(
        broken, host="127.0.0.1", port=serving.free_port(), startup_timeout_s=120, log_path=tmp_path / "s.log"
    )
    with pytest.raises(serving.ServingError, match="exited with code") as caught, server:
        pytest.fail("a server without a model must not become healthy")
    assert f"lines of {tmp_path / 's.log'}" in str(caught.value)


@pytest.mark.slow
def test_serve_runs_the_champion_until_ctrl_c(tmp_path, registry):
    import requests

    tracking.promote(registry, MODEL, "2")
    port = serving.free_port()
    argv = [
        f"--model-name={MODEL}",
        f"--tracking-uri={registry}",
        f"--port={port}",
        f"--serve-dir={tmp_path / 'serve'}",
        f"--outputs-dir={tmp_path / 'outputs'}",
    ]
    env = {**os.environ, "PYTHONPATH": str(Path(deploy.__file__).resolve().parents[1])}
    proc = subprocess.Popen(
        [sys.executable, "-m", "steps.serve", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        assert proc.stdout is not None
        banner = proc.stdout.readline()  # blocks until the server is healthy (or serve exits: empty line)
        assert banner.startswith(f"serving {tmp_path / 'serve'}/{MODEL}-v2 at http://127.0.0.1:{port}"), banner
        curl = next(line for line in iter(proc.stdout.readline, "") if "curl" in line)
        assert f"http://127.0.0.1:{port}/v1/chat/completions" in curl
        reply = requests.post(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8, "temperature": 0},
            timeout=120,
        )
        assert reply.status_code == 200 and reply.json()["choices"][0]["message"]["content"]
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0, proc.stderr.read() if proc.stderr else ""
    finally:
        serving.stop(proc)
    assert (tmp_path / "outputs" / "model_version").read_text() == "2"
    assert not listening(port)
