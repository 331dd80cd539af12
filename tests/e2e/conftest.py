"""Shared fixtures of the end-to-end tests: one vLLM engine per session (the converted base model:
tests/conftest.py), one Ray cluster per module that trains with Ray, and a tiny random Llama for the tests about
training mechanics.

A vLLM engine takes one to three minutes to start on 2 cores and two engines stall each other, so the runs that
are not about starting an engine (the gate, the S3 source, the GPU variant, the rollout scenarios) adopt one
engine started once for the session: the local fleet uses $EKSFLOW_VLLM_URL instead of starting its own
(eksflow/llm/serving/local_fleet.py). The flagship's full run and `serve` start their own engines
(test_local_run.py), while the shared one idles (~2 CPU s a minute); its later runs adopt the shared engine. Under
pytest-xdist (`make test`: two workers) one worker runs the modules that start engines, in the order ENGINE_MODULES
gives (tests/conftest.py), so the session has one shared engine and two engines never load at once; the other
worker trains meanwhile. Like every engine eksflow starts, it asks for its key on every route
(eksflow/llm/steps/common/vllm_auth.py); runs that adopt it get the key as $EKSFLOW_VLLM_API_KEY. Like every fleet
engine it resolves adapters by name from its adapter folder (eksflow/llm/steps/common/adapters.py): runs that adopt it
publish there ($EKSFLOW_VLLM_ADAPTERS; published names carry the version's run id, so two tests' "v1" never collide).
The standalone Ray Train runs of a module join one Ray cluster (`ray_cluster`)."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from eksflow.llm import engines
from eksflow.llm.steps.common import vllm, vllm_auth, vllm_client, vllm_process
from eksflow.llm.steps.common.base_model import DEMO_MODEL, resolve_model
from eksflow.runtime.ports import free_port
from pipelines.llama_lora import LlamaLoraConfig

BASE_NAME = "llama-lora-base"  # what the fleet's Deployment serves the base model as
DEMO_STEPS = LlamaLoraConfig().train.max_steps  # the demo adapter's training steps: the flagship's own


class SharedEngine:
    """A vLLM engine for the session: spawned early (it loads while a fixture trains), started again if killed."""

    def __init__(self, model_dir: Path, log_dir: Path) -> None:
        self.model_dir = model_dir
        self.log_dir = log_dir
        self.process: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.log = log_dir / "vllm.log"
        self.adapters_dir = log_dir / "adapters"  # its resolver folder: published adapters, by name
        self.api_key = secrets.token_urlsafe(32)  # one for the session: a restarted engine keeps it
        self.args: list[str] = []  # the engine's argv after the module, and its environment (`spawn`)
        self.env: dict[str, str] = {}
        self.scratch = ""  # its temporary folder (vllm_process.scratch_folder)

    def spawn(self) -> None:
        """Start the engine unless it runs; do not wait for it."""
        if self.process is not None and self.process.poll() is None:
            return
        self.port = free_port()
        settings = vllm.EngineSettings()
        self.args = [*vllm.engine_args(str(self.model_dir), BASE_NAME, self.port, settings), "--host=127.0.0.1"]
        self.adapters_dir.mkdir(parents=True, exist_ok=True)
        engine_env = vllm.engine_env(settings, cpu=True, adapters_dir=str(self.adapters_dir))
        self.python = engines.command(engines.ENGINES["vllm"])  # `make setup` installs it
        self.scratch = vllm_process.scratch_folder()
        env = {**engine_env, vllm_auth.KEY_ENV: self.api_key}
        self.env = vllm_process.engine_process_env(env, self.python, self.scratch)
        self.log = self.log_dir / f"vllm-{int(time.time())}.log"
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen(
                [self.python, "-m", vllm.ENGINE_MODULE, *self.args],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
            )

    @property
    def address(self) -> str:
        """The engine's address, spawning it if needed, without waiting (a run's fleet waits for it)."""
        self.spawn()
        return f"http://127.0.0.1:{self.port}"

    @property
    def adoption(self) -> dict[str, str]:
        """The environment that makes a run use this engine instead of starting its own (it may still load)."""
        return {
            "EKSFLOW_VLLM_URL": self.address,
            "EKSFLOW_VLLM_API_KEY": self.api_key,
            "EKSFLOW_VLLM_ADAPTERS": str(self.adapters_dir),
        }

    @property
    def url(self) -> str:
        """The engine's address, once it runs and generates."""
        base = self.address
        vllm_client.wait_ready(
            base, BASE_NAME, api_key=self.api_key, timeout_s=1800, process=self.process, log_path=self.log
        )
        return base

    def stop(self) -> None:
        """Stop the engine and all its processes, SIGKILLed after 5 s: at the session's end it has nothing to finish
        (its SIGTERM shutdown took ~30 s of the last test's teardown)."""
        if self.process is not None:
            vllm_process.stop(self.process, grace_s=5)
            shutil.rmtree(self.scratch, ignore_errors=True)


@pytest.fixture(scope="session")
def shared_engine(model_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedEngine]:
    """The session's vLLM engine (see the module docstring); runs adopt it with `adopt_engine`."""
    engine = SharedEngine(resolve_model(DEMO_MODEL, model_cache), tmp_path_factory.mktemp("engine"))
    try:
        yield engine
    finally:
        engine.stop()


@pytest.fixture
def adopt_engine(shared_engine: SharedEngine, monkeypatch: pytest.MonkeyPatch) -> SharedEngine:
    """Make this test's runs use the shared engine instead of starting their own (it may still be loading)."""
    for name, value in shared_engine.adoption.items():
        monkeypatch.setenv(name, value)
    return shared_engine


class DemoAdapter:
    """The session's demo adapter: SmolLM2 trained DEMO_STEPS steps on data/demo, and evaluate's report on it.

    The flagship's full run (test_local_run.py, run before test_rollout.py: ENGINE_MODULES) trains one and leaves it
    here; test_rollout.py takes it instead of training another (~75 s under `make test`), and trains one itself when
    it runs without that run."""

    def __init__(self) -> None:
        self.trained: tuple[Path, Path] | None = None  # (adapter folder, eval_report.json)


@pytest.fixture(scope="session")
def demo_adapter() -> DemoAdapter:
    return DemoAdapter()


class RayCluster:
    """A one-node Ray cluster (`ray start --head`), keyed by a token, on 127.0.0.1.

    Standalone train runs join it through RAY_ADDRESS, the way the train step joins a KubeRay cluster, instead of
    each starting and stopping a local Ray (its GCS, raylet, dashboard and agents: ~15 s of CPU a run here).
    Pipeline runs keep starting their own, as their RayJob's head does."""

    def __init__(self, log_dir: Path) -> None:
        port = free_port()
        self.address = f"127.0.0.1:{port}"
        self.env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
        ray = Path(sys.executable).with_name("ray")
        command = [
            str(ray), "start", "--head", "--block", "--disable-usage-stats", "--node-ip-address=127.0.0.1",
            f"--port={port}", "--num-cpus=2", "--dashboard-host=127.0.0.1", f"--object-store-memory={128 * 1024**2}",
            # Free ports, not `ray start`'s fixed defaults: a pipeline run's Ray on the other pytest-xdist worker may
            # hold 8265 (ray.init moves on to the next free port; `ray start` given a port does not).
            f"--dashboard-port={free_port()}", f"--dashboard-agent-listen-port={free_port()}",
            f"--ray-client-server-port={free_port()}",
        ]  # fmt: skip
        self.log = log_dir / "ray.log"
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen(
                command, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **self.env}, start_new_session=True
            )

    def wait_ready(self, timeout_s: float = 300) -> None:
        """Until a driver can connect (the GCS answers and the node registered)."""
        deadline = time.monotonic() + timeout_s
        probe = [sys.executable, "-c", f"import ray; ray.init(address={self.address!r}); ray.shutdown()"]
        while subprocess.run(probe, env={**os.environ, **self.env}, capture_output=True, check=False).returncode:
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"ray start did not come up:\n{self.log.read_text(errors='replace')[-3000:]}")
            time.sleep(1)

    def join(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Make the processes a test starts from now on join this cluster (RAY_ADDRESS and its token)."""
        monkeypatch.setenv("RAY_ADDRESS", self.address)
        for name, value in self.env.items():
            monkeypatch.setenv(name, value)

    def stop(self) -> None:
        """Stop the cluster and every process in its group, SIGKILLed after 5 s (`ray start --block` takes ~34 s
        to stop its processes one by one; a test cluster has nothing to save)."""
        vllm_process.stop(self.process, grace_s=5)


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayCluster]:
    """A Ray cluster for the module's Ray Train runs; `joined_ray` points a test's runs at it. Per module, not per
    session: an idle cluster costs ~4 CPU seconds a minute (its dashboard, agents and idle workers), more over a
    session than the start-ups it saves."""
    cluster = RayCluster(tmp_path_factory.mktemp("ray"))
    try:
        cluster.wait_ready()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def joined_ray(ray_cluster: RayCluster, monkeypatch: pytest.MonkeyPatch) -> RayCluster:
    """Make this test's `eksflow.llm.steps.train --launcher=ray` runs join the module's cluster."""
    ray_cluster.join(monkeypatch)
    return ray_cluster


@pytest.fixture(scope="session")
def tiny_llama(model_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random Llama of 2 layers, width 64, with the demo model's tokenizer: the model of the tests about training
    mechanics (strategies, checkpoints, preemption, fan-out), where real weights add only time. Measured: a 2-worker
    Ray FSDP run of 8 steps took 152 CPU s on SmolLM2-135M, 66 s on this."""
    from images.checks.tiny_model import write_model

    folder = tmp_path_factory.mktemp("tiny-llama")
    write_model(resolve_model(DEMO_MODEL, model_cache), folder)
    return folder


def training_folder(root: Path, model: Path) -> Path:
    """`root` holding a copy of `model` (model/) and a dataset of 40 examples (data/train.jsonl)."""
    import json

    shutil.copytree(model, root / "model")
    (root / "data").mkdir()
    rows = [{"prompt": f"What is {i} plus {i}?", "completion": f"{i} plus {i} is {2 * i}."} for i in range(40)]
    (root / "data" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root
