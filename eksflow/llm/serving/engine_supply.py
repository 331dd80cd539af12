"""The serving engines a run needs, made ready beside its first tasks, side by side; the fleet waits only if need be.

A fresh machine's first run spent 245 s installing both engines (LiteLLM, then vLLM) before its first task, though
the fleet is applied only after training. Now `prepare` (the fleet's hook, called before the run starts anything)
checks in one line what can be known at once (the cache's path and folders, an engine named by its variable exists)
and returns a Preparation the executor begins as the run starts: one thread per engine, side by side, installs it
where it is missing or not what its lock installed (eksflow.llm.engines.ready: ~0.3 s when it is), or runs an engine
named by its variable once (`--version` of the proxy's program, vLLM's import check in its interpreter). A failure
stops the run at once, in one line (`failure`), before training, never after. The fleet's Deployment asks `program`
for its engine, which waits for an engine still being made, saying so in one line; a Deployment applied with no
Preparation begun (a test applying objects itself) makes its engine ready there.

Engines are per machine, so the jobs are per process: a later run of the same process finds its engines ready, and
lines go to the display of the run that began them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from eksflow.llm import engines
from eksflow.llm.serving import fleet_pods
from eksflow.llm.serving.adopted_engine import adopted_url
from eksflow.llm.serving.fleet_pods import FleetError

_CHECK_S = 300  # an engine named by its variable gets this long to show it runs (vLLM's import takes ~10 s)


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@dataclass
class _Job:
    """One engine being made ready: its program once it is, or why it cannot be."""

    engine: engines.Engine
    done: threading.Event = field(default_factory=threading.Event)
    program: str = ""
    error: engines.EngineError | None = None


class _Supply:
    """This process's engine jobs, by engine and where it is, and where their lines go."""

    def __init__(self) -> None:
        self._jobs: dict[tuple[str, str], _Job] = {}
        self._lock = threading.Lock()
        self.say: Callable[[str], None] = _stderr

    def start(self, name: str) -> _Job:
        """A new job for the engine, unless one is under way (it is checked again for each run: ~0.3 s)."""
        with self._lock:
            job = self._jobs.get(_key(name))
            if job is None or job.done.is_set():
                job = self._jobs[_key(name)] = _Job(engines.ENGINES[name])
                threading.Thread(target=self._work, args=(job,), name=f"engine-{name}", daemon=True).start()
            return job

    def _work(self, job: _Job) -> None:
        try:
            job.program = _ready(job.engine, self.tell)
        except engines.EngineError as err:
            job.error = err
        except OSError as err:  # the cache's disk or folder failing under the install
            job.error = engines.EngineError(f"{job.engine.what}: {err}")
        finally:
            job.done.set()

    def tell(self, line: str) -> None:
        """Show `line` on the display of the run that began the latest job (`say` is set by each run)."""
        self.say(line)

    def job(self, name: str) -> _Job | None:
        """The engine's latest job, if any."""
        with self._lock:
            return self._jobs.get(_key(name))


def _key(name: str) -> tuple[str, str]:
    """An engine where this run takes it from: its variable's program, or its folder in the cache."""
    engine = engines.ENGINES[name]
    return name, os.environ.get(engine.override_env) or str(engines.folder(engine))


_SUPPLY = _Supply()


def _ready(engine: engines.Engine, say: Callable[[str], None]) -> str:
    """The engine's program once it runs: made ready in the cache, or the one its variable names run once."""
    if not os.environ.get(engine.override_env):
        return engines.ready(engine, say)
    program = engines.command(engine)
    argv = [program, "-c", engine.check] if engine.program == "python" else [program, "--version"]
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, env={**os.environ, **engine.check_env}, timeout=_CHECK_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        raise engines.EngineError(f"${engine.override_env}={program}: {engine.what} does not run ({err})") from None
    if done.returncode != 0:
        said = fleet_pods.error_line((done.stderr + done.stdout).splitlines()) or f"exit {done.returncode}"
        raise engines.EngineError(f"${engine.override_env}={program}: {engine.what} does not run: {said}")
    return program


def tell(line: str) -> None:
    """Show `line` on the display of the run that began the engines' latest jobs (stderr before any did)."""
    _SUPPLY.tell(line)


def roles(objects: Sequence[Mapping[str, Any]]) -> list[str]:
    """The engines the objects' Deployments run here (not an adopted vLLM, which runs already)."""
    deployments = [m for m in objects if m.get("kind") == "Deployment"]
    found = {fleet_pods.role(fleet_pods.container(m, "Deployment"), "Deployment") for m in deployments}
    if adopted_url():
        found.discard("vllm")
    return sorted(found)


@dataclass
class Preparation:
    """The engines of one run, made ready beside its first tasks (eksflow.local.services' Preparing)."""

    names: list[str]
    jobs: list[_Job] = field(default_factory=list)

    def begin(self, say: Callable[[str], None]) -> None:
        """Start making each engine ready, side by side; `say` shows a line on the run's display."""
        _SUPPLY.say = say
        self.jobs = [_SUPPLY.start(name) for name in self.names]

    def failure(self) -> str:
        """Why the run must stop: the first engine that cannot be made ready, as one line ("" while none failed)."""
        failed = next((job.error for job in self.jobs if job.error is not None), None)
        return f"{failed.label}: {failed}" if failed is not None else ""


def prepare(objects: Sequence[Mapping[str, Any]]) -> Preparation | None:
    """Check at once what can be known of the engines the objects need (EngineError); what `begin` then makes ready."""
    names = roles(objects)
    for name in names:
        engine = engines.ENGINES[name]
        if os.environ.get(engine.override_env):
            engines.command(engine)  # the file it names exists
        else:
            engines.installed(engine)  # the cache's path and folders may be trusted
    return Preparation(names) if names else None


def program(name: str, stop_reason: Callable[[], str], where: str) -> str:
    """The engine's program for a Deployment, once it is ready (waited for while it is made); FleetError if it fails."""
    job = _SUPPLY.job(name)
    if job is None:  # no run began it: make it ready here
        try:
            return _ready(engines.ENGINES[name], _SUPPLY.tell)
        except engines.EngineError as err:
            raise FleetError(f"{where}: {err.label}: {err}") from None
    if not job.done.is_set():
        _SUPPLY.tell(f"{where}: waits for {job.engine.what}, being made ready beside the run's tasks")
    while not job.done.wait(1.0):
        if why := stop_reason():
            raise FleetError(f"{where}: {why} while {job.engine.what} was being made ready")
    if job.error is not None:
        raise FleetError(f"{where}: {job.error.label}: {job.error}")
    return job.program
