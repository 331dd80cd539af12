"""Shared fixtures: a real S3 API on 127.0.0.1 (moto_server, a dev dependency), started once per session, and the
session's model cache (the base model converted once for every run that needs it, by every pytest-xdist worker)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from eksflow.runtime.ports import free_port

# OpenMP threads that wait for work sleep instead of spinning. Two pytest-xdist workers run torch processes side by
# side, each with as many threads as cores: spinning, two 20-step local trainings together took over 370 s against
# 22 s alone; sleeping, 28 s for both, and 22.3 s alone either way.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
MOTO_SERVER = Path(sys.executable).with_name("moto_server")
# The e2e modules that start vLLM engines (tests/e2e/conftest.py): under pytest-xdist one worker runs all of them,
# in this order, while the others take every other test one at a time. The first starts the session's shared engine,
# which loads while it trains and then idles (~2 CPU s a minute) while test_local_run.py's full run starts engines of
# its own; that run trains the demo adapter test_rollout.py takes.
ENGINE_MODULES = (
    "tests/e2e/test_own_llm_project.py",
    "tests/e2e/test_local_run.py",
    "tests/e2e/test_locked_routes.py",
    "tests/e2e/test_dpo_run.py",
    "tests/e2e/test_full_rollout.py",
    "tests/e2e/test_rollout.py",
)
STARTUP_TIMEOUT_S = 30.0


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """pytest-xdist's scheduler with ENGINE_MODULES as one unit of work, each other e2e module a unit, and every
    other test a unit of its own.

    An e2e module's tests share what its module fixtures start (a Ray or Slurm cluster, a proxy whose routes each
    test builds on): split over two workers, each would start its own, and a later test could run without the
    earlier ones. (xdist's own `--dist loadgroup` groups from marks, but it renames tests by a Node field pytest 9
    no longer reads, so its groups never form.) Units go out largest first: the engine modules start at once."""
    from xdist.scheduler import LoadScopeScheduling

    class ModulesTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            if module in ENGINE_MODULES:
                return "engine modules"
            return module if module.startswith("tests/e2e/") else nodeid

    return ModulesTogether(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Slow tests first, each group in file order but ENGINE_MODULES in theirs: under pytest-xdist the long units
    start first and the short ones fill the end, so no worker waits on another's last long test."""

    def order(item: pytest.Item) -> tuple[bool, int]:
        module = item.nodeid.split("::", 1)[0]
        engine_order = ENGINE_MODULES.index(module) if module in ENGINE_MODULES else -1
        return item.get_closest_marker("slow") is None, engine_order

    items.sort(key=order)


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
    """One converted base model for every run of the session (a run converts it on first use).

    Under pytest-xdist the workers share one cache beside their own temporary folders: the cache publishes under a
    lock (eksflow.llm.steps.common.storage.exclusive), so the first worker converts the model and the others wait for
    it."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return tmp_path_factory.mktemp("models")
    shared = tmp_path_factory.getbasetemp().parent / "models"
    shared.mkdir(exist_ok=True)
    return shared


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Endpoint URL of a moto S3 server for the whole session; each test makes its own bucket."""
    port = free_port()
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
