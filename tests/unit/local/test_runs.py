"""The run verbs the CLI builds on: list, get (host paths), logs and follow, resume, retry -p, resubmit."""

import io
import threading
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from eksflow.local import (
    LocalExecutorError,
    Phase,
    changed_inputs,
    follow_log,
    follow_task_log,
    list_runs,
    load_run,
    resubmit_run,
    resume_workflow,
    retry_run,
    task_log,
)
from eksflow.local.runs import RESUBMITTED_FROM
from tests.unit.local.manifests import container, inputs, lines, outputs, params, run, task, workflow

# Writes its output path (a container path on the fsx volume) and fails with exit code argv[2] unless it is "0".
WRITE_AND_EXIT = """
import os, sys
print("working on", sys.argv[3])
os.makedirs(os.path.dirname(sys.argv[1]), exist_ok=True)
open(sys.argv[1], "w").write(sys.argv[3])
sys.exit(int(sys.argv[2]))
"""


def pipeline(code: str = "{{workflow.parameters.code}}") -> dict[str, Any]:
    first = container(
        "first",
        WRITE_AND_EXIT,
        "/tmp/outputs/where",
        "0",
        "/fsx/data/{{workflow.name}}",
        outputs=outputs("where"),
    )
    second = container(
        "second", WRITE_AND_EXIT, "/tmp/outputs/x", "{{inputs.parameters.code}}", "x", inputs=inputs("code")
    )
    for template in (first, second):
        template["container"]["volumeMounts"] = [{"name": "fsx", "mountPath": "/fsx"}]
    manifest = workflow(
        [task("first", "first"), task("second", "second", "first", arguments=params(code=code))],
        [first, second],
        volumes=[{"name": "fsx", "persistentVolumeClaim": {"claimName": "fsx-claim"}}],
        arguments=params(code="1"),
    )
    manifest["metadata"]["labels"] = {"eksflow.dev/pipeline": "demo"}
    return manifest


def console() -> Console:
    return Console(file=io.StringIO())


def test_list_and_get_show_phases_durations_and_host_paths(tmp_path: Path) -> None:
    failed = run(pipeline(), tmp_path)
    succeeded = run(pipeline(), tmp_path, parameters={"code": "0"})
    listed = list_runs(tmp_path / "state")
    assert {r.name: r.phase for r in listed} == {failed.name: Phase.FAILED, succeeded.name: Phase.SUCCEEDED}
    assert all(r.pipeline == "demo" and r.duration_s is not None and r.started_at for r in listed)

    view = load_run(tmp_path / "state", failed.name)
    assert (view.phase, view.running, view.parameters) == (Phase.FAILED, False, {"code": "1"})
    assert {k: n.phase for k, n in view.nodes.items()} == {"first": Phase.SUCCEEDED, "second": Phase.FAILED}
    assert view.nodes["second"].exit_code == 1
    assert view.nodes["first"].outputs == {"where": f"/fsx/data/{failed.name}"}  # as Argo shows it
    host = tmp_path / "state" / "volumes" / "fsx-claim" / "data" / failed.name
    assert view.host_outputs("first") == {"where": str(host)}  # as this machine has it
    with pytest.raises(LocalExecutorError, match=r"no run 'nope' in .*runs there: "):
        load_run(tmp_path / "state", "nope")


def test_logs_and_follow(tmp_path: Path) -> None:
    failed = run(pipeline(), tmp_path)
    path = task_log(tmp_path / "state", failed.name, "second")
    assert path == failed.run_dir / "logs" / "second.log"
    assert "working on x" in lines(path)
    assert list(follow_task_log(tmp_path / "state", failed.name, "first", poll_s=0.01))[-1].startswith("working on")
    with pytest.raises(LocalExecutorError, match=r"no node of run .* is called 'third'; give one of: first, second"):
        task_log(tmp_path / "state", failed.name, "third")

    growing = tmp_path / "growing.log"
    finished = threading.Event()

    def write() -> None:
        with open(growing, "a") as log:
            for i in range(3):
                log.write(f"line {i}\n")
                log.flush()
        finished.set()

    writer = threading.Thread(target=write)
    writer.start()
    assert list(follow_log(growing, done=finished.is_set, poll_s=0.01)) == ["line 0", "line 1", "line 2"]
    writer.join()


def test_retry_overrides_parameters_keeps_succeeded_tasks_and_records_overrides(tmp_path: Path) -> None:
    failed = run(pipeline(), tmp_path)
    retried = retry_run(tmp_path / "state", failed.name, {"code": "0"}, cwd=tmp_path, console=console())
    assert retried.phase == Phase.SUCCEEDED and retried.name == failed.name
    assert retried.parameters == {"code": "0"}
    first_runs = [line for line in lines(failed.run_dir / "logs" / "first.log") if line.startswith("working on")]
    assert len(first_runs) == 1  # kept from the failed run, not run again
    view = load_run(tmp_path / "state", failed.name)
    assert view.parameters == {"code": "0"}
    assert [o["parameters"] for o in view.overrides] == [{"code": "0"}]
    with pytest.raises(LocalExecutorError, match="already Succeeded"):
        retry_run(tmp_path / "state", failed.name, cwd=tmp_path, console=console())
    with pytest.raises(LocalExecutorError, match="unknown workflow parameter 'nope'; known: code"):
        retry_run(tmp_path / "state", run(pipeline(), tmp_path).name, {"nope": "1"}, cwd=tmp_path)


def test_resubmit_is_a_new_run_of_the_same_manifest(tmp_path: Path) -> None:
    failed = run(pipeline(), tmp_path)
    again = resubmit_run(tmp_path / "state", failed.name, {"code": "0"}, cwd=tmp_path, console=console())
    assert again.name != failed.name and again.name.startswith("test-")
    assert again.phase == Phase.SUCCEEDED
    view = load_run(tmp_path / "state", again.name)
    assert view.labels == {"eksflow.dev/pipeline": "demo", RESUBMITTED_FROM: failed.name}
    assert load_run(tmp_path / "state", failed.name).phase == Phase.FAILED  # the original is untouched


def test_resume_refuses_changed_inputs_naming_them(tmp_path: Path) -> None:
    failed = run(pipeline(), tmp_path)
    changed = pipeline()
    changed["spec"]["arguments"] = params(code="0")
    changed["spec"]["templates"][0]["container"]["args"][1] = "3"
    assert changed_inputs(pipeline(), {"code": "1"}, changed, None).other == ["template 'first'"]
    with pytest.raises(LocalExecutorError) as refused:
        resume_workflow(failed.run_dir, cwd=tmp_path, console=console(), manifest=changed)
    assert str(refused.value) == (
        f"run {failed.name!r} started with other inputs (parameter code, template 'first' changed); resuming keeps "
        "the run's own inputs: resume without --set/--config changes, re-run its failed tasks with new parameter "
        f"values (retry {failed.name} -p NAME=VALUE), or start a new run"
    )
    with pytest.raises(LocalExecutorError, match=r"\(parameter code changed\)"):
        resume_workflow(failed.run_dir, cwd=tmp_path, console=console(), parameters={"code": "0"})
    # The same inputs resume (and fail again the same way here: exit 1 is not bad input, so it is resumable).
    again = resume_workflow(failed.run_dir, cwd=tmp_path, console=console(), manifest=pipeline())
    assert again.phase == Phase.FAILED and again.resumable


def test_a_bad_input_failure_is_not_resumable(tmp_path: Path) -> None:
    bad = run(pipeline(), tmp_path, parameters={"code": "2"})
    assert bad.phase == Phase.FAILED
    assert bad.bad_input == ["second"] and not bad.resumable
    flaky = run(pipeline(), tmp_path, parameters={"code": "1"})
    assert flaky.bad_input == [] and flaky.resumable
