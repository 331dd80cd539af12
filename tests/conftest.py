"""Shared fixtures: a real S3 API on 127.0.0.1 (moto_server, a dev dependency), started once per session, and the
session's model cache (the base model converted once for every run that needs it)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

MOTO_SERVER = Path(sys.executable).with_name("moto_server")
STARTUP_TIMEOUT_S = 30.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1):
            return True
    except urllib.error.HTTPError:
        return True  # any HTTP answer means the server is up
    except OSError:
        return False


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One converted base model for every run of the session (a run converts it on first use)."""
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Endpoint URL of a moto S3 server for the whole session; each test makes its own bucket."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path_factory.mktemp("moto") / "moto_server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [str(MOTO_SERVER), "-H", "127.0.0.1", "-p", str(port)], stdout=out, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not _answers(url):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"moto_server did not answer on {url}:\n{log.read_text(errors='replace')}")
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="session")
def s3_environment(s3_server: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str | None]:
    """The environment that points boto3 at `s3_server` and away from any real AWS config (None: unset)."""
    nothing = tmp_path_factory.mktemp("no-aws")
    return {
        "AWS_ENDPOINT_URL": s3_server,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_CONFIG_FILE": str(nothing / "config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(nothing / "credentials"),
        **dict.fromkeys(("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_REGION")),
    }


@pytest.fixture
def s3_env(s3_server: str, s3_environment: dict[str, str | None], monkeypatch: pytest.MonkeyPatch) -> str:
    """Point boto3 at `s3_server` for one test; returns the endpoint URL."""
    for name, value in s3_environment.items():
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    return s3_server
