"""A vLLM engine's process: its interpreter, environment and temporary folder, started and always stopped.

Whoever starts an engine (`serve`, a local run's fleet, the tests' shared engine) owns its whole process tree and
its temporary folder: vllm.py says what the engine is asked to do, this module how it lives and ends, and what its
log says when it fails (`log_excerpt`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from eksflow.errors import EXIT_BAD_INPUT
from eksflow.llm import engines
from eksflow.llm.steps.common.vllm import ENGINE_MODULE
from eksflow.runtime.args import StepFailedError, StepInputError
from eksflow.runtime.readable import log_tail

SCRATCH_PREFIX = "eksflow-vllm-"


def vllm_python() -> str:
    """The interpreter that has vLLM: $EKSFLOW_VLLM_PYTHON, else the engine installed here, else this one (images).

    The engine of the machine's cache is checked against its lock first (eksflow.llm.engines.command): one that is
    not what its lock installed, or a cache that cannot be trusted, fails the step in one line.
    """
    engine = engines.ENGINES["vllm"]
    try:
        return engines.command(engine) if engines.installed(engine) else sys.executable
    except engines.EngineError as err:
        raise (StepInputError if err.exit_code == EXIT_BAD_INPUT else StepFailedError)(str(err)) from None


@contextmanager
def engine(
    args: Sequence[str], env: Mapping[str, str], *, log_path: Path, python: str = ""
) -> Iterator[subprocess.Popen[bytes]]:
    """Start `python -m vllm.entrypoints.openai.api_server <args>` in its own session; always stop it.

    Whoever starts the engine owns its whole process tree: SIGTERM and SIGHUP end the owner as Ctrl-C does
    (KeyboardInterrupt), so the engine is stopped with it instead of being left serving, re-parented to init.
    SIGINT too, even when the owner was started with it ignored (as a shell starts a background job): Python then
    leaves it ignored, and `serve` stopped with SIGINT kept serving.
    """
    import signal

    python = python or vllm_python()
    log_path.parent.mkdir(parents=True, exist_ok=True)
    scratch = scratch_folder()
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            [python, "-m", ENGINE_MODULE, *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=engine_process_env(env, python, scratch),
            start_new_session=True,  # Ctrl-C reaches us only; we stop the engine's whole process group
        )
    previous = {}
    if threading.current_thread() is threading.main_thread():  # signals reach the main thread only
        previous = {s: signal.signal(s, _interrupt) for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)}
    try:
        yield process
    finally:
        for number in previous:  # a second signal must not cut the stopping short
            signal.signal(number, signal.SIG_IGN)
        stop(process)
        shutil.rmtree(scratch, ignore_errors=True)
        for number, handler in previous.items():
            signal.signal(number, handler)


def scratch_folder() -> str:
    """A temporary folder of one engine's own (its TMPDIR), for its owner to remove once the engine has stopped.

    vLLM leaves its ZeroMQ sockets and its processes' rendezvous file (vllm_dist_*) in the temporary folder: every
    engine started left ~8 entries in /tmp.
    """
    return tempfile.mkdtemp(prefix=SCRATCH_PREFIX)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def engine_process_env(env: Mapping[str, str], python: str, scratch: str) -> dict[str, str]:
    """This environment plus `env` and TMPDIR=`scratch` (scratch_folder), and eksflow on the engine's PYTHONPATH.

    For an engine `python` other than this one, eksflow comes first on its path: vLLM's own interpreter (a
    virtualenv of eksflow.llm.engines) imports the --middleware from there, and nothing else of this interpreter's
    packages.
    """
    own = {**os.environ, **env, "TMPDIR": scratch}
    if python == sys.executable:
        return own
    path = os.environ.get("PYTHONPATH", "")
    return {**own, "PYTHONPATH": os.pathsep.join(p for p in (engines.eksflow_path(), path) if p)}


def stop(process: subprocess.Popen[Any], grace_s: float = 15) -> None:
    """SIGTERM the process group, SIGKILL what is left after `grace_s`: no engine process outlives its owner."""
    import signal

    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=grace_s)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)  # the engine core and worker processes, if the server left them
    process.wait()


def log_excerpt(log_path: Path | None) -> str:
    """The last lines of the engine's log, introduced, for an error message."""
    if log_path is None:
        return "no log"
    if not log_path.is_file():
        return f"no log at {log_path}"
    tail = log_tail(log_path)
    return f"last {len(tail)} lines of {log_path}:\n" + "\n".join(tail)
