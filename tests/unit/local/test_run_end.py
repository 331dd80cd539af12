"""How a run ends, as Argo ends a workflow: Running until onExit has ended, onExit again on every retry, and an
executor bug ending the run Failed in one line with its exit handler run and no node left unfinished."""

import json
from pathlib import Path

import pytest

from eksflow.local import resume_workflow
from eksflow.local.phase import FULFILLED
from eksflow.local.scheduler import Scheduler
from tests.unit.local.manifests import APPEND, EXIT_WITH, container, dag, lines, run, task, workflow

# The exit handler records the workflow's phase as status.json says it while the handler runs.
STATUS_NOW = (
    "import json, os, sys; doc = json.load(open(os.path.join(os.environ['EKSFLOW_RUN_DIR'], 'status.json')));"
    "open(sys.argv[1], 'a').write(doc['status']['phase'] + ' ' + sys.argv[2] + '\\n')"
)


def exit_recording(tmp_path: Path, main_code: str, *main_args: str) -> dict:
    return workflow(
        [task("work", "work")],
        [
            container("work", main_code, *main_args),
            container("exit-handler", STATUS_NOW, str(tmp_path / "exit.log"), "{{workflow.status}}"),
        ],
        onExit="exit-handler",
    )


def test_the_workflow_stays_running_until_its_exit_handler_ends(tmp_path: Path) -> None:
    result = run(exit_recording(tmp_path, EXIT_WITH, str(tmp_path / "work.log"), "1"), tmp_path)
    assert lines(tmp_path / "exit.log") == ["Running Failed"]  # status.json said Running; workflow.status Failed
    assert result.phase == "Failed"
    document = json.loads((result.run_dir / "status.json").read_text())
    assert document["status"]["phase"] == "Failed" and document["status"]["finishedAt"]


def test_a_resumed_run_runs_its_exit_handler_again(tmp_path: Path) -> None:
    flag = tmp_path / "fail-once"
    flag.write_text("")
    code = "import os, sys; os.path.exists(sys.argv[1]) and (os.remove(sys.argv[1]), sys.exit(1))"
    first = run(exit_recording(tmp_path, code, str(flag)), tmp_path)
    assert first.phase == "Failed" and first.nodes["onExit"].phase == "Succeeded"
    again = resume_workflow(first.run_dir, cwd=tmp_path)
    assert again.phase == "Succeeded"
    assert lines(tmp_path / "exit.log") == ["Running Failed", "Running Succeeded"]
    nodes = json.loads((first.run_dir / "status.json").read_text())["status"]["nodes"]
    assert {n["displayName"]: n["phase"] for n in nodes.values()} == {
        "work": "Succeeded",
        "onExit": "Succeeded",
    }


def test_a_resumed_run_runs_every_task_of_its_exit_handler_dag_again_with_the_new_outcome(tmp_path: Path) -> None:
    flag = tmp_path / "fail-once"
    flag.write_text("")
    code = "import os, sys; os.path.exists(sys.argv[1]) and (os.remove(sys.argv[1]), sys.exit(1))"
    manifest = workflow(
        [task("work", "work")],
        [
            container("work", code, str(flag)),
            container("notify", APPEND, str(tmp_path / "exit.log"), "{{workflow.status}}"),
            dag("exit-handler", [task("report", "notify"), task("alert", "notify", "report")]),
        ],
        onExit="exit-handler",
    )
    first = run(manifest, tmp_path)
    assert first.phase == "Failed" and first.nodes["onExit.report"].phase == "Succeeded"
    again = resume_workflow(first.run_dir, cwd=tmp_path)
    assert again.phase == "Succeeded"
    assert lines(tmp_path / "exit.log") == ["Failed", "Failed", "Succeeded", "Succeeded"]  # report, alert; twice
    assert {k: n.phase for k, n in again.nodes.items()} == dict.fromkeys(
        ["work", "onExit", "onExit.report", "onExit.alert"], "Succeeded"
    )


@pytest.mark.parametrize("where", ["entrypoint", "exit-handler"])
def test_an_executor_bug_fails_the_run_in_one_line_and_leaves_a_consistent_status(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    real = Scheduler._expand
    broken = "later" if where == "entrypoint" else "onExit"

    def fault(self, run, dag_task):  # a bug the executor meets while it expands one task
        if dag_task.name == broken:
            raise ValueError("nan is not a JSON number")
        return real(self, run, dag_task)

    monkeypatch.setattr(Scheduler, "_expand", fault)
    manifest = workflow(
        [task("first", "record"), task("later", "record", "first"), task("last", "record", "later")],
        [
            container("record", APPEND, str(tmp_path / "ran.log"), "task"),
            container("exit-handler", APPEND, str(tmp_path / "exit.log"), "{{workflow.status}}"),
        ],
        onExit="exit-handler",
    )
    result = run(manifest, tmp_path)
    assert result.phase == "Failed"
    assert result.message == "local executor error: ValueError: nan is not a JSON number"
    document = json.loads((result.run_dir / "status.json").read_text())
    assert document["status"]["phase"] == "Failed"
    assert all(n["phase"] in {str(p) for p in FULFILLED} for n in document["status"]["nodes"].values())
    if where == "entrypoint":
        assert lines(tmp_path / "exit.log") == ["Failed"]  # the exit handler ran, and saw the failure
        assert result.nodes["first"].phase == "Succeeded" and result.nodes["last"].phase == "Omitted"
    else:
        assert lines(tmp_path / "ran.log") == ["task"] * 3
