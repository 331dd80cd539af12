"""scripts/local_slurm.py trusts a pid file only while it names its daemon: `down` runs as root and signals it.

Real processes stand in for the daemons: `sleep` under the daemon's name (argv[0]) is what /proc shows of one.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "local_slurm.py"
spec = importlib.util.spec_from_file_location("local_slurm", SCRIPT)
assert spec is not None and spec.loader is not None
local_slurm = importlib.util.module_from_spec(spec)
sys.modules["local_slurm"] = local_slurm  # its dataclasses look their module up
spec.loader.exec_module(local_slurm)


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        process.kill()
        process.wait()


def sleeping(processes: list[subprocess.Popen[bytes]], name: str = "sleep") -> subprocess.Popen[bytes]:
    """`sleep 300` whose command line says `name` (as a daemon's says its own)."""
    process = subprocess.Popen([name, "300"], executable=shutil.which("sleep"))
    processes.append(process)
    # Popen returns once the child let go of our memory, a moment before exec() has set up its command line.
    while not Path(f"/proc/{process.pid}/cmdline").read_bytes():
        time.sleep(0.01)
    return process


def test_down_signals_no_process_a_pid_file_names_unless_it_is_the_daemon(tmp_path, monkeypatch, processes, capsys):
    """`sleep 300 & echo $! > slurmrestd.pid; local_slurm.py down` killed the sleep (as root: any process)."""
    monkeypatch.setenv("EKSFLOW_SLURM_DIR", str(tmp_path))
    planted = sleeping(processes)
    (tmp_path / "slurmrestd.pid").write_text(f"{planted.pid}\n")
    assert not local_slurm.running(tmp_path / "slurmrestd.pid")  # `up` starts slurmrestd instead of skipping it
    local_slurm.down()
    time.sleep(0.2)
    assert planted.poll() is None  # still running: never signalled
    assert (
        f"slurmrestd.pid names '{planted.pid}', which is not its daemon now: nothing signalled"
        in capsys.readouterr().err
    )
    assert not (tmp_path / "slurmrestd.pid").exists()


def test_a_pid_counts_while_its_process_is_the_daemon_that_wrote_it(tmp_path, monkeypatch, processes):
    monkeypatch.setenv("EKSFLOW_SLURM_DIR", str(tmp_path))
    daemon = sleeping(processes, "slurmrestd")
    pid_file = tmp_path / "slurmrestd.pid"
    pid_file.write_text(str(daemon.pid))
    assert local_slurm.daemon_pid(pid_file) == daemon.pid

    link = tmp_path / "slurmctld.pid"
    link.symlink_to(pid_file)  # a link is nobody's pid file
    assert local_slurm.daemon_pid(link) is None

    hour_ago = time.time() - 3600
    os.utime(pid_file, (hour_ago, hour_ago))  # the file was written before this process started: its pid was reused
    assert local_slurm.daemon_pid(pid_file) is None
    assert not local_slurm.running(pid_file)

    pid_file.write_text(str(daemon.pid))  # written again by the daemon itself
    local_slurm.down()
    assert daemon.wait(timeout=15) == -15  # SIGTERM: it was the daemon
