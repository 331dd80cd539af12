"""A state folder that cannot be written: refused before anything starts, or a run that ends Failed in one line with
its tasks stopped, nothing half-written and no temporary file left; and the read verbs never write.

The unit tests make the executor's writes fail as a full disk does (ENOSPC, or EROFS for a read-only folder) from the
moment a task says so; the last two run the CLI on a real read-only mount and a real full tmpfs, in a mount
namespace of their own (root only: as root, chmod does not stop a write).
"""

import builtins
import errno
import io
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from pydantic import BaseModel
from rich.console import Console

from eksflow.cli import parser
from eksflow.local import StateWriteError, list_runs, load_run, resume_workflow
from eksflow.run import execute
from eksflow.runtime.args import StepArgs, run_step
from eksflow.runtime.outputs import Progress
from eksflow.verbs import run_verb
from tests.unit.local.manifests import WRITE_OUTPUT, container, outputs, run, task, workflow

REPO = Path(__file__).resolve().parents[3]
GREETER = REPO / "tests" / "fixtures" / "greeter"
TOUCH = "import pathlib, sys; pathlib.Path(sys.argv[1]).touch()"
# `slow` records its pid and runs long; `fill` waits for that record, then marks the disk full (argv[1]).
SLOW = "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(30)"
MARK_FULL_ONCE_SLOW_RUNS = """
import pathlib, sys, time
while not pathlib.Path(sys.argv[2]).is_file():
    time.sleep(0.05)
pathlib.Path(sys.argv[1]).touch()
"""
MEMOIZE = {"key": "next-1", "maxAge": "1h", "cache": {"configMap": {"name": "eksflow-memo"}}}
PROBLEM = "cannot write the state folder: "


class FailingDisk:
    """From the moment `trigger` exists, every write this process makes under `root` to a path `which` accepts
    (opening for writing, mkdir, rename) fails with `code`, as it does on a full disk or a read-only mount.

    Task processes are not affected: the real mounts below are for them.
    """

    def __init__(
        self, monkeypatch: pytest.MonkeyPatch, root: Path, trigger: Path, which: Callable[[Path], bool], code: int
    ) -> None:
        self.root, self.trigger, self.which, self.code = root, trigger, which, code
        real_open, real_mkdir, real_replace = builtins.open, os.mkdir, os.replace

        def opened(file, mode="r", *args, **kwargs):
            if any(m in mode for m in "wax+"):
                self.check(file)
            return real_open(file, mode, *args, **kwargs)

        def made(path, *args, **kwargs):
            if Path(os.fsdecode(path)).parent.is_dir():  # else FileNotFoundError first, as the kernel says
                self.check(path)
            return real_mkdir(path, *args, **kwargs)

        def replaced(source, target, *args, **kwargs):
            self.check(target)
            return real_replace(source, target, *args, **kwargs)

        monkeypatch.setattr(builtins, "open", opened)
        monkeypatch.setattr(io, "open", opened)
        monkeypatch.setattr(os, "mkdir", made)
        monkeypatch.setattr(os, "replace", replaced)

    def check(self, file: object) -> None:
        if not isinstance(file, (str, os.PathLike)):
            return
        path = Path(os.fsdecode(file)).absolute()
        if path.is_relative_to(self.root) and self.trigger.exists() and self.which(path):
            raise OSError(self.code, os.strerror(self.code), str(path))


def named(*names: str) -> Callable[[Path], bool]:
    return lambda path: any(path.name == n or path.name.startswith(f".{n}.") for n in names)


WRITE_POINTS = {
    "status.json": named("status.json"),
    "owner.json": named("owner.json"),
    "log": lambda path: path.suffix == ".log",
    "outputs": named("outputs"),
    "memo-entry": lambda path: "memoize" in path.parts,
}


def filling(tmp_path: Path) -> dict:
    """`slow` runs long; `fill` says the disk is full once `slow` runs; `next` (memoized, one output) runs after it."""
    slow = container("slow", SLOW, str(tmp_path / "slow.pid"))
    fill = container("fill", MARK_FULL_ONCE_SLOW_RUNS, str(tmp_path / "full"), str(tmp_path / "slow.pid"))
    after = container("next", WRITE_OUTPUT, "/tmp/outputs/x", "1", outputs=outputs("x"), memoize=MEMOIZE)
    return workflow([task("slow", "slow"), task("fill", "fill"), task("next", "next", "fill")], [slow, fill, after])


def files(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()}


def running(pid: int) -> bool:
    """Whether process `pid` still runs (a zombie does not: it has ended, only its exit status is left)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


def temporary(root: Path) -> list[str]:
    return [str(p) for p in root.rglob(".*") if p.is_file()]


@pytest.mark.parametrize("where", WRITE_POINTS, ids=WRITE_POINTS)
def test_a_run_that_cannot_write_its_state_ends_failed_in_one_line_with_its_tasks_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], where: str
) -> None:
    state = tmp_path / "state"
    FailingDisk(monkeypatch, state, tmp_path / "full", WRITE_POINTS[where], errno.ENOSPC)
    result = run(filling(tmp_path), tmp_path)
    assert not running(int((tmp_path / "slow.pid").read_text()))  # `slow` was stopped, not left running
    assert result.phase == "Failed"
    assert result.message.startswith(PROBLEM) and "No space left on device" in result.message, result.message
    assert "\n" not in result.message and "--state-dir" in result.message
    assert result.nodes["slow"].phase == "Failed" and result.nodes["slow"].message == result.message
    assert f"workflow {result.name} Failed: {PROBLEM}" in result.output
    assert "Traceback" not in result.output + capsys.readouterr().err
    assert temporary(state) == []
    for document in ("status.json", "owner.json"):  # whole: the last version written in full
        assert isinstance(json.loads((result.run_dir / document).read_text()), dict)
    view = load_run(state, result.name)  # however far status.json got, it reads as Failed
    assert view.phase == "Failed" and not view.running


def test_when_the_disk_fills_get_shows_each_task_as_the_run_ended_it_not_as_executor_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`fill` succeeds as it fills the disk: no new status.json fits, but the last one goes in the room kept for it."""
    state = tmp_path / "state"
    FailingDisk(monkeypatch, state, tmp_path / "full", lambda path: path.name == ".status.json.tmp", errno.ENOSPC)
    result = run(filling(tmp_path), tmp_path)
    assert result.phase == "Failed" and "No space left on device" in result.message
    assert result.nodes["fill"].phase == "Succeeded"
    view = load_run(state, result.name)
    assert (view.phase, view.message) == (result.phase, result.message)
    assert {k: (n.phase, n.message) for k, n in view.nodes.items()} == {
        k: (n.phase, n.message) for k, n in result.nodes.items()
    }
    assert temporary(state) == []  # the room kept became status.json


def test_a_state_folder_that_cannot_be_written_refuses_the_run_in_one_line_before_anything_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marks = tmp_path / "marks"
    manifest = workflow([task("first", "first")], [container("first", TOUCH, str(marks))])
    (tmp_path / "read-only").touch()
    FailingDisk(monkeypatch, tmp_path / "state", tmp_path / "read-only", lambda path: True, errno.EROFS)
    with pytest.raises(StateWriteError) as refused:
        execute(manifest, tmp_path / "state", None, Console(file=io.StringIO()), root=tmp_path)
    assert refused.value.exit_code == 2
    assert f"{refused.value.label}: {refused.value}".splitlines() == [
        f"cannot run locally: {PROBLEM}{tmp_path / 'state'}: Read-only file system; use a state folder this user can "
        "write (--state-dir, EKSFLOW_STATE_DIR)"
    ]
    assert not marks.exists() and not (tmp_path / "state").exists()


def test_a_new_run_that_cannot_start_leaves_no_folder_and_a_resume_leaves_the_run_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    failed = run(workflow([task("bad", "bad")], [container("bad", "import sys; sys.exit(1)")]), tmp_path)
    before = files(tmp_path / "state")
    (tmp_path / "full").touch()
    FailingDisk(monkeypatch, tmp_path / "state", tmp_path / "full", named("status.json"), errno.ENOSPC)
    with pytest.raises(StateWriteError, match=f"^{PROBLEM}") as refused:
        execute(filling(tmp_path), tmp_path / "state", None, Console(file=io.StringIO()), root=tmp_path)
    assert refused.value.exit_code == 2
    assert [r.name for r in list_runs(tmp_path / "state")] == [failed.name]  # the new run's folder is gone
    FailingDisk(monkeypatch, tmp_path / "state", tmp_path / "full", lambda path: True, errno.ENOSPC)  # now all
    with pytest.raises(Exception, match=PROBLEM):
        resume_workflow(failed.run_dir, cwd=tmp_path)
    assert files(tmp_path / "state") == before


class GreetArgs(StepArgs):
    name: str


class Greeting(BaseModel):
    greeting: str


def test_a_step_that_cannot_write_its_outputs_fails_in_one_line_and_leaves_no_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "outputs"
    folder.mkdir()
    (folder / "greeting").write_text("an earlier attempt's")
    monkeypatch.setenv("ARGO_PROGRESS_FILE", str(tmp_path / "progress"))
    FailingDisk(monkeypatch, tmp_path, tmp_path, lambda path: path.name in ("greeting", "progress"), errno.ENOSPC)

    def greet(args: GreetArgs) -> Greeting:
        with Progress(1, "greet") as progress:  # a progress file is a display: it cannot fail the work
            progress.advance()
        return Greeting(greeting=f"hello {args.name}")

    assert run_step(GreetArgs, greet, ["--name=ada", f"--outputs-dir={folder}"]) == 1  # a retry may find room
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == f"error: cannot write the outputs to {folder}: No space left on device"
    assert "Traceback" not in err
    assert [p.name for p in folder.iterdir()] == ["greeting"]  # as it was: no temporary file beside it
    assert (folder / "greeting").read_text() == "an earlier attempt's"
    assert not (tmp_path / "progress").exists() and temporary(tmp_path) == []


def dead_run(tmp_path: Path) -> str:
    """A run whose status.json says Running while no executor holds it (killed with its watchdog)."""
    done = run(workflow([task("first", "first")], [container("first", "print('hello')")]), tmp_path)
    status = done.run_dir / "status.json"
    document = json.loads(status.read_text())
    document["status"]["phase"] = document["status"]["nodes"]["first"]["phase"] = "Running"
    status.write_text(json.dumps(document))
    return done.name


def test_the_read_verbs_write_nothing_and_show_a_run_whose_executor_died_as_failed(tmp_path: Path, capsys) -> None:
    name = dead_run(tmp_path)
    before = files(tmp_path / "state")
    assert [(r.name, r.phase, r.message) for r in list_runs(tmp_path / "state")] == [
        (name, "Failed", "executor stopped")
    ]
    view = load_run(tmp_path / "state", name)
    assert (view.phase, view.nodes["first"].phase) == ("Failed", "Failed")
    for argv in (["get", name], ["logs", name], ["logs", name, "first"], ["list"]):
        args = parser("demo.py", "").parse_args([*argv, "--state-dir", str(tmp_path / "state")])
        run_verb(args, "demo", tmp_path, Console(file=io.StringIO()))
    out = capsys.readouterr().out
    assert f"{name} Failed: executor stopped" in out and "hello" in out
    assert files(tmp_path / "state") == before  # status.json still says Running: the next executor records it


# -- a real read-only mount and a real full disk ---------------------------------------------------------------


def namespaces() -> str:
    """Why mount namespaces cannot be used here ("" when they can)."""
    if os.geteuid() != 0:
        return "needs root: mounting a read-only folder or a tiny tmpfs (chmod does not stop root's writes)"
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        return "needs unshare(1) and mount(8)"
    probe = subprocess.run(["unshare", "--mount", "true"], capture_output=True, check=False)
    return "" if probe.returncode == 0 else f"unshare --mount fails here: {probe.stderr.decode().strip()}"


needs_mounts = pytest.mark.skipif(bool(namespaces()), reason=namespaces() or "mounts work")

# Runs in a mount namespace of its own: argv[1] a shell line mounting the state folder, argv[2:] the commands to
# run after it (JSON lists), each as the user would, in the greeter project. Prints what each did as JSON, with the
# state folder's files before and after each, and its temporary files.
IN_NAMESPACE = """
import json, os, subprocess, sys
from pathlib import Path
subprocess.run(sys.argv[1], shell=True, check=True)
state = Path(os.environ["STATE"])
def files():
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in state.rglob("*") if p.is_file()}
done = []
for command in sys.argv[2:]:
    argv, env = json.loads(command)
    before = files()
    ended = subprocess.run(argv, cwd=os.environ["GREETER"], env={**os.environ, **env}, capture_output=True, text=True)
    done.append({"rc": ended.returncode, "out": ended.stdout, "err": ended.stderr, "wrote": files() != before})
temporary = [str(p) for p in state.rglob(".*") if p.is_file()]
documents = {}
for path in state.rglob("*.json"):
    try:
        documents[str(path)] = isinstance(json.loads(path.read_text()), dict)
    except ValueError:
        documents[str(path)] = False
print(json.dumps({"done": done, "temporary": temporary, "documents": documents}))
"""


def in_namespace(state: Path, mount: str, *commands: tuple[list[str], dict[str, str]]) -> dict:
    env = {**os.environ, "STATE": str(state), "GREETER": str(GREETER), "PYTHONPATH": str(REPO)}
    argv = ["unshare", "--mount", "--propagation", "private", sys.executable, "-c", IN_NAMESPACE, mount]
    ended = subprocess.run(
        [*argv, *(json.dumps(c) for c in commands)], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert ended.returncode == 0, ended.stderr
    return json.loads(ended.stdout)


def greeter(*args: str) -> list[str]:
    return [sys.executable, "-m", "pipelines.hello", *args]


@needs_mounts
def test_on_a_read_only_state_folder_run_is_refused_in_one_line_and_the_read_verbs_work(tmp_path: Path) -> None:
    name = dead_run(tmp_path)
    state = tmp_path / "state"
    done = in_namespace(
        state,
        f"mount --bind -o ro {state} {state}",
        (greeter("run"), {"EKSFLOW_STATE_DIR": str(state / "new")}),
        (greeter("run", "--state-dir", str(state)), {}),
        (greeter("run", "--resume", name, "--state-dir", str(state)), {}),
        (greeter("list", "--all", "--state-dir", str(state)), {}),
        (greeter("get", name, "--state-dir", str(state)), {}),
        (greeter("logs", name, "--state-dir", str(state)), {}),
    )["done"]
    refused = [d["err"].strip().splitlines() for d in done[:3]]
    assert [d["rc"] for d in done] == [2, 2, 2, 0, 1, 0], done
    assert all(len(lines) == 1 and lines[0].startswith(f"cannot run locally: {PROBLEM}") for lines in refused), done
    assert all("Read-only file system; use a state folder this user can write" in lines[0] for lines in refused)
    assert f"{name}  Failed" in done[3]["out"] and f"{name} Failed: executor stopped" in done[4]["out"]
    assert "hello" in done[5]["out"]
    assert not any("Traceback" in d["err"] for d in done)
    assert [r.name for r in list_runs(state)] == [name]  # nothing was added


# The run's second task fills the disk (a file beside the runs) and succeeds; the executor then cannot write its state.
FILL = (
    "import sys\nwith open(sys.argv[1], 'wb', buffering=0) as ballast:\n    while True:\n        try:\n"
    "            ballast.write(b'x' * 4096)\n        except OSError:\n            break"
)
RUN = """
import json, sys
from pathlib import Path
from rich.console import Console
from eksflow.run import execute
from eksflow.runtime.args import StepArgs, run_step
from eksflow.runtime.outputs import Progress
sys.exit(execute(json.loads(sys.argv[2]), Path(sys.argv[1]), None, Console(stderr=True, width=300), root=Path.cwd()))
"""


@needs_mounts
def test_on_a_full_disk_the_run_ends_failed_in_one_line_and_get_still_reads_it(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    manifest = workflow(
        [task("greet", "greet"), task("fill", "fill", "greet"), task("after", "greet", "fill")],
        [
            container("greet", WRITE_OUTPUT, "/tmp/outputs/x", "hello", outputs=outputs("x")),
            container("fill", FILL, str(state / "ballast")),
        ],
    )
    manifest["metadata"] = {"name": "filled"}
    reading = ["get", "filled", "--state-dir", str(state)]
    seen = in_namespace(
        state,
        f"mount -t tmpfs -o size=512k tmpfs {state}",
        ([sys.executable, "-c", RUN, str(state), json.dumps(manifest)], {"PYTHONPATH": str(REPO)}),
        (greeter(*reading), {}),
        (greeter("list", "--all", "--state-dir", str(state)), {}),
        (greeter("logs", "filled", "--state-dir", str(state)), {}),
    )
    ran, got, listed, logs = seen["done"]
    assert ran["rc"] == 1, ran
    assert "Traceback" not in ran["err"]
    ended = [line for line in ran["err"].splitlines() if line.startswith("workflow filled Failed")]
    assert ended and ended[0].startswith(f"workflow filled Failed: {PROBLEM}{state}/runs/filled/"), ran["err"]
    assert "No space left on device; free space on its disk" in ended[0]
    assert seen["temporary"] == [] and all(seen["documents"].values()), seen
    assert (got["rc"], listed["rc"], logs["rc"]) == (1, 0, 0), seen
    assert got["out"].startswith(f"filled Failed: {PROBLEM}{state}/runs/filled/"), got["out"]
    assert "greet  Succeeded" in got["out"] and "fill  Succeeded" in got["out"]  # as the run printed them
    assert "executor stopped" not in got["out"]
    assert not any(d["wrote"] or "Traceback" in d["err"] for d in (got, listed, logs))
