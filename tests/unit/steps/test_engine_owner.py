"""Whatever starts a vLLM engine owns its whole process tree: SIGTERM, SIGHUP or SIGINT of the owner stops the
engine and its children (`make serve` stopped by a supervisor left the engine serving, re-parented to PID 1; one
started with SIGINT ignored, as a shell starts a background job, ignored Ctrl-C and kept serving), and removes the
files the engine left in its temporary folder (vLLM's sockets and rendezvous file piled up in /tmp)."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eksflow.llm.steps.common import vllm_process

ROOT = Path(__file__).resolve().parents[3]
# Stands in for vLLM's API server: leaves a file in its temporary folder as vLLM does (a ZeroMQ socket), writes its
# PID, its child's (the engine core) and that file's path, then serves forever.
FAKE_ENGINE = """
import os, subprocess, sys, tempfile, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
left = os.path.join(tempfile.gettempdir(), "vllm_dist_0")
open(left, "w").close()
open(os.environ["FAKE_PIDS"], "w").write(f"{os.getpid()} {child.pid} {left}")
time.sleep(600)
"""
OWNER = """
import sys, time
from pathlib import Path
from eksflow.llm.steps.common import vllm_process
with vllm_process.engine([], {}, log_path=Path(sys.argv[1]), python=sys.executable):
    time.sleep(600)
"""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie is gone for our purpose
        return stat.read().split(")")[-1].split()[0] != "Z"


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT], ids=["SIGTERM", "SIGHUP", "SIGINT"])
def test_a_signal_to_the_owner_stops_the_engine_and_its_children(tmp_path, signum):
    package = tmp_path / "vllm" / "entrypoints" / "openai"
    package.mkdir(parents=True)
    for folder in (tmp_path / "vllm", tmp_path / "vllm" / "entrypoints", package):
        (folder / "__init__.py").write_text("")
    (package / "api_server.py").write_text(FAKE_ENGINE)
    pids_file = tmp_path / "pids"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join((str(ROOT), str(tmp_path))), "FAKE_PIDS": str(pids_file)}
    # Started with SIGINT ignored, as a shell without job control starts a background job (`trap "" INT`: the
    # ignored signal survives exec).
    start = 'trap "" INT; exec "$0" -c "$1" "$2"'
    owner = subprocess.Popen(
        ["sh", "-c", start, sys.executable, OWNER, str(tmp_path / "engine.log")], cwd=ROOT, env=env
    )
    deadline = time.monotonic() + 60
    while not (pids_file.is_file() and pids_file.read_text()) and time.monotonic() < deadline:
        time.sleep(0.1)
    engine, core, left = pids_file.read_text().split()
    assert Path(left).is_file() and Path(left).parent.name.startswith(vllm_process.SCRATCH_PREFIX)  # not /tmp itself
    owner.send_signal(signum)
    owner.wait(timeout=60)
    deadline = time.monotonic() + 30
    while (alive(int(engine)) or alive(int(core))) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(int(engine)) and not alive(int(core)), "the engine outlived the process that started it"
    assert not Path(left).parent.exists()
