"""A `run` stopped by SIGTERM, SIGHUP or SIGKILL leaves no task process behind and no run that claims Running.

Each test starts the real CLI (`eksflow.cli.run`) on a one-task workflow whose step starts a grandchild (`sleep`),
as a train step starts Ray workers, and records both PIDs; then stops the CLI and checks by PID.
"""

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

from eksflow.local import Phase, load_run, resume_workflow

REPO = Path(__file__).resolve().parents[3]
# argv: state dir, marks folder, resume (run name or ""). The step writes "<its pid> <grandchild pid>" to
# marks/pids, and finishes at once when marks/pids already exists (a resumed run). Like the train step committing
# a checkpoint, it takes a moment to stop on SIGTERM.
RUN_CLI = """
import sys
from pathlib import Path
from hera.workflows import DAG, Container, Workflow
from rich.console import Console
from eksflow.errors import EksflowError
from eksflow.run import execute

state_dir, marks, resume = sys.argv[1], sys.argv[2], sys.argv[3] or None
code = (
    "import os, pathlib, signal, subprocess, sys, time; pids = pathlib.Path(sys.argv[1]) / 'pids'; "
    "again = pids.exists(); child = None if again else subprocess.Popen(['sleep', '60']); "
    "pids.write_text(f'{os.getpid()} {child.pid if child else 0}'); "
    "signal.signal(signal.SIGTERM, lambda *_: (time.sleep(0.3), sys.exit(143))); time.sleep(0 if again else 60)"
)
with Workflow(name="sleepy", entrypoint="main") as workflow:
    hang = Container(name="hang", image="python:3.11", command=["python", "-c", code], args=[marks])
    with DAG(name="main"):
        hang()
try:  # as the command line's `main` does
    sys.exit(execute(workflow.to_dict(), Path(state_dir), resume, Console(stderr=True, width=200), root=Path.cwd()))
except EksflowError as err:
    print(f"{err.label}: {err}", file=sys.stderr)
    sys.exit(err.exit_code)
"""


def cli(tmp_path: Path, resume: str = "") -> subprocess.Popen[str]:
    command = [sys.executable, "-c", RUN_CLI, str(tmp_path / "state"), str(tmp_path), resume]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(predicate, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def ended(pid: int) -> bool:
    """Gone, or a zombie: killed, and only waiting for its new parent to reap it."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")


def started_step(tmp_path: Path) -> tuple[subprocess.Popen[str], list[int]]:
    proc = cli(tmp_path)
    pids = tmp_path / "pids"
    wait_for(lambda: pids.exists() and len(pids.read_text().split()) == 2)
    return proc, [int(p) for p in pids.read_text().split()]


def status(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "state" / "runs" / "sleepy" / "status.json").read_text())["status"]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_sigterm_and_sighup_stop_the_run_like_ctrl_c(tmp_path: Path, signum: int) -> None:
    proc, pids = started_step(tmp_path)
    proc.send_signal(signum)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signum, stderr
    assert "Traceback" not in stderr
    assert stderr.splitlines()[-1] == "interrupted: workflow sleepy stopped; resume with: --resume sleepy"
    assert (status(tmp_path)["phase"], status(tmp_path)["message"]) == ("Failed", "interrupted")
    assert status(tmp_path)["nodes"]["hang"]["message"] == "interrupted"
    assert all(ended(pid) for pid in pids), pids  # the step and its grandchild


def test_sigkill_of_the_cli_takes_its_tasks_with_it_and_the_run_resumes(tmp_path: Path) -> None:
    proc, pids = started_step(tmp_path)
    proc.kill()
    proc.wait(timeout=30)
    wait_for(lambda: all(ended(pid) for pid in pids))  # PR_SET_PDEATHSIG and the watchdog
    wait_for(lambda: status(tmp_path)["phase"] == "Failed")
    assert status(tmp_path)["message"] == "executor stopped"
    assert status(tmp_path)["nodes"]["hang"]["phase"] == "Failed"
    resumed = cli(tmp_path, "sleepy")
    _, stderr = resumed.communicate(timeout=60)
    assert resumed.returncode == 0, stderr
    assert status(tmp_path)["phase"] == "Succeeded"


def test_a_run_whose_executor_and_watchdog_died_reads_as_failed_and_is_settled_by_its_next_executor(
    tmp_path: Path,
) -> None:
    proc, pids = started_step(tmp_path)
    owner = json.loads((tmp_path / "state" / "runs" / "sleepy" / "owner.json").read_text())
    assert owner["pid"] == proc.pid and str(pids[0]) in owner["processes"]
    os.kill(owner["watchdogPid"], signal.SIGKILL)  # nothing left to clean up after the executor
    wait_for(lambda: ended(owner["watchdogPid"]))
    proc.kill()
    proc.wait(timeout=30)
    wait_for(lambda: ended(pids[0]))  # the step got its parent-death signal
    assert not ended(pids[1])  # its grandchild did not: an orphan
    assert status(tmp_path)["phase"] == "Running"  # nobody has looked yet

    view = load_run(tmp_path / "state", "sleepy")
    assert (view.phase, view.message, view.running) == (Phase.FAILED, "executor stopped", False)
    assert view.orphans == {pids[0]: "hang"}  # the step's session, found by its recorded PID
    assert status(tmp_path)["phase"] == "Running"  # a reader writes nothing (a read-only state folder reads too)

    out = io.StringIO()
    result = resume_workflow(tmp_path / "state" / "runs" / "sleepy", cwd=tmp_path, console=Console(file=out))
    assert result.phase == "Succeeded", result.message
    assert ended(pids[1])
    assert f"stopped task processes the previous executor left running: {pids[0]} (hang)" in out.getvalue()


def test_a_second_executor_on_a_running_run_is_refused_in_one_line(tmp_path: Path) -> None:
    proc, pids = started_step(tmp_path)
    try:
        second = cli(tmp_path, "sleepy")
        _, stderr = second.communicate(timeout=60)
        assert second.returncode == 2, stderr
        assert stderr.strip().splitlines() == [
            f"cannot run locally: run 'sleepy' is still being run by another executor (executor PID {proc.pid}); "
            "wait for it, or stop it (Ctrl-C, or kill that PID) and resume again"
        ]
        assert not ended(pids[0])  # the first run is untouched
        assert load_run(tmp_path / "state", "sleepy").running
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    assert all(ended(pid) for pid in pids)


def test_a_finished_run_leaves_no_watchdog_and_an_executor_error_stops_its_tasks(tmp_path, monkeypatch) -> None:
    from eksflow.local.scheduler import Scheduler
    from tests.unit.local.manifests import container, run, task, workflow

    done = run(workflow([task("ok", "ok")], [container("ok", "pass")]), tmp_path)
    owner = json.loads((done.run_dir / "owner.json").read_text())
    assert owner["pid"] == os.getpid() and owner["processes"] == {}
    wait_for(lambda: ended(owner["watchdogPid"]))

    pid_file = tmp_path / "pid"
    slow = container("slow", "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(60)")
    slow["container"]["args"] = [str(pid_file)]
    advance = Scheduler.advance

    def broken(self, dag_run):  # a bug in the scheduler, once the task runs
        advance(self, dag_run)
        if pid_file.exists() and pid_file.read_text():
            raise RuntimeError("scheduler bug")

    monkeypatch.setattr(Scheduler, "advance", broken)
    failed = run(workflow([task("slow", "slow")], [slow]), tmp_path)
    assert ended(int(pid_file.read_text()))
    document = json.loads((failed.run_dir / "status.json").read_text())["status"]
    assert (document["phase"], document["message"]) == ("Failed", "local executor error: RuntimeError: scheduler bug")
    assert document["nodes"]["slow"]["phase"] == "Failed"


GET_DEATH_SIGNAL = """
import ctypes, ctypes.util
libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
value = ctypes.c_int(0)
libc.prctl(2, ctypes.byref(value), 0, 0, 0)  # PR_GET_PDEATHSIG
print("pdeathsig", value.value)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.parametrize("launcher", ["setpriv", "preexec"])
def test_every_task_process_gets_a_parent_death_signal(tmp_path: Path, monkeypatch, launcher: str) -> None:
    from eksflow.local import process

    if launcher == "setpriv":
        if process._setpriv() is None:
            pytest.skip("no setpriv with --pdeathsig here")
    else:
        monkeypatch.setattr(process, "_launcher", lambda: ([], process._death_signal_preexec()))
    log_path = tmp_path / "log"
    with open(log_path, "ab") as log:
        ended_as = process.run(
            [sys.executable, "-c", GET_DEATH_SIGNAL],
            key="t",
            cwd=tmp_path,
            env=dict(os.environ),
            log=log,
            tracker=process.ProcessTracker(),
            stop_reason=lambda: "",
            deadline_s=None,
        )
    assert ended_as.exit_code == 0
    assert log_path.read_text().split() == ["pdeathsig", str(int(signal.SIGTERM))]


# A task (argv[1]: its folder) shaped like the train step under Ray: its worker is a child process with the default
# SIGTERM action, as Ray's workers and daemons are. On SIGTERM the task asks the worker for a checkpoint through its
# stdin, waits for it, and exits 143; the worker writes `committed` when asked. The task writes `ready` once both run.
DRIVER_WITH_A_WORKER = """
import pathlib, signal, subprocess, sys, time
folder = pathlib.Path(sys.argv[1])
worker = subprocess.Popen(
    [sys.executable, "-c", "import pathlib, sys; sys.stdin.readline(); pathlib.Path(sys.argv[1]).write_text('step 7')",
     str(folder / "committed")],
    stdin=subprocess.PIPE, text=True,
)
def stop(signum, frame):
    worker.stdin.write("commit\\n")
    worker.stdin.flush()
    worker.wait()
    sys.exit(143)
signal.signal(signal.SIGTERM, stop)
(folder / "ready").write_text("yes")
time.sleep(60)
"""


def test_a_stopped_task_alone_gets_sigterm_so_its_workers_live_to_commit_before_they_go(tmp_path: Path) -> None:
    """As kubelet stops a container: SIGTERM to its process, SIGKILL to the rest once it ended. A SIGTERM to every
    process of the task's session killed the train step's Ray workers before the step could ask them to commit."""
    from eksflow.local import process

    ready = tmp_path / "ready"
    with open(tmp_path / "log", "ab") as log:
        ended_as = process.run(
            [sys.executable, "-c", DRIVER_WITH_A_WORKER, str(tmp_path)],
            key="train",
            cwd=tmp_path,
            env=dict(os.environ),
            log=log,
            tracker=process.ProcessTracker(),
            stop_reason=lambda: "interrupted" if ready.exists() else "",
            deadline_s=None,
        )
    assert (ended_as.exit_code, ended_as.stopped_for) == (143, "interrupted"), (tmp_path / "log").read_text()
    assert (tmp_path / "committed").read_text() == "step 7"
