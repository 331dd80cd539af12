import io
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from eksflow.local import LocalExecutorError, resume_workflow
from tests.unit.local.manifests import (
    APPEND,
    EXIT_WITH,
    WRITE_OUTPUT,
    container,
    lines,
    phases,
    run,
    task,
    workflow,
)

WAIT_FOR_OTHER = """
import pathlib, sys, time
marks, me, other = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3]
(marks / f"running-{me}").touch()
deadline = time.monotonic() + 20
while not (marks / f"running-{other}").exists() and time.monotonic() < deadline:
    time.sleep(0.05)
(marks / f"saw-{me}").write_text(str((marks / f"running-{other}").exists()))
"""


def test_dag_order_and_parallel_branches(tmp_path: Path) -> None:
    order, marks = tmp_path / "order", tmp_path / "marks"
    marks.mkdir()
    manifest = workflow(
        [
            task("a", "append", arguments={"parameters": [{"name": "who", "value": "a"}]}),
            task(
                "b",
                "wait",
                "a",
                arguments={"parameters": [{"name": "me", "value": "b"}, {"name": "other", "value": "c"}]},
            ),
            task(
                "c",
                "wait",
                "a",
                arguments={"parameters": [{"name": "me", "value": "c"}, {"name": "other", "value": "b"}]},
            ),
            task("d", "append", "b && c", arguments={"parameters": [{"name": "who", "value": "d"}]}),
        ],
        [
            container(
                "append", APPEND, str(order), "{{inputs.parameters.who}}", inputs={"parameters": [{"name": "who"}]}
            ),
            container(
                "wait",
                WAIT_FOR_OTHER,
                str(marks),
                "{{inputs.parameters.me}}",
                "{{inputs.parameters.other}}",
                inputs={"parameters": [{"name": "me"}, {"name": "other"}]},
            ),
        ],
    )
    result = run(manifest, tmp_path)
    assert result.phase == "Succeeded", result.message
    assert lines(order) == ["a", "d"]
    # Each branch saw the other one running: they ran at the same time.
    assert (marks / "saw-b").read_text() == "True"
    assert (marks / "saw-c").read_text() == "True"
    assert "  d                  Succeeded" in result.output


def test_parallelism_caps_running_tasks(tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    code = """
import pathlib, sys, time
marks, me = pathlib.Path(sys.argv[1]), sys.argv[2]
(marks / f"running-{me}").touch()
time.sleep(0.3)
(marks / f"seen-{me}").write_text(",".join(sorted(p.name for p in marks.glob("running-*"))))
(marks / f"running-{me}").unlink()
"""
    template = container("t", code, str(marks), "{{inputs.parameters.me}}", inputs={"parameters": [{"name": "me"}]})
    tasks = [task(n, "t", arguments={"parameters": [{"name": "me", "value": n}]}) for n in ("a", "b", "c")]
    result = run(workflow(tasks, [template], parallelism=1), tmp_path)
    assert result.phase == "Succeeded"
    assert [(marks / f"seen-{n}").read_text() for n in ("a", "b", "c")] == ["running-a", "running-b", "running-c"]


def test_depends_and_when_semantics(tmp_path: Path) -> None:
    log = tmp_path / "log"
    manifest = workflow(
        [
            task("fails", "exit", arguments={"parameters": [{"name": "code", "value": "1"}]}),
            task("after-success", "ok", "fails"),
            task("on-failure", "ok", "fails.Failed"),
            task("skipped", "ok", when="false == true"),
            task("after-skip", "ok", "skipped"),
            task("needs-skip-succeeded", "ok", "skipped.Succeeded"),
            task("after-omitted", "ok", "after-success.Omitted && on-failure"),
        ],
        [
            container(
                "exit", EXIT_WITH, str(log), "{{inputs.parameters.code}}", inputs={"parameters": [{"name": "code"}]}
            ),
            container("ok", "print('ok')"),
        ],
    )
    result = run(manifest, tmp_path)
    assert phases(result) == {
        "fails": "Failed",
        "after-success": "Omitted",
        "on-failure": "Succeeded",
        "skipped": "Skipped",
        "after-skip": "Succeeded",
        "needs-skip-succeeded": "Omitted",
        "after-omitted": "Succeeded",
    }
    assert result.nodes["fails"].exit_code == 1
    assert "false == true" in result.nodes["skipped"].message
    # The failure was expected by `fails.Failed`, so it neither stops the DAG nor fails the workflow.
    assert result.phase == "Succeeded"


def test_fail_fast_omits_tasks_not_started(tmp_path: Path) -> None:
    # `slow` waits until the status file shows `boom` Failed, so the failure is seen while it still runs.
    wait_for_failure = """
import json, pathlib, sys, time
deadline = time.monotonic() + 20
while time.monotonic() < deadline:
    for status in pathlib.Path(sys.argv[1]).glob("runs/*/status.json"):
        if json.loads(status.read_text())["status"]["nodes"]["boom"]["phase"] == "Failed":
            sys.exit(0)
    time.sleep(0.05)
sys.exit(3)
"""
    manifest = workflow(
        [task("boom", "boom"), task("slow", "slow"), task("next", "ok", "slow")],
        [
            container("boom", "import sys; print('disk on fire'); sys.exit(1)"),
            container("slow", wait_for_failure, str(tmp_path / "state")),
            container("ok", "print('ok')"),
        ],
    )
    result = run(manifest, tmp_path)
    assert phases(result) == {"boom": "Failed", "slow": "Succeeded", "next": "Omitted"}
    assert "fail fast" in result.nodes["next"].message
    assert result.phase == "Failed"
    assert "boom" in result.message
    # The failed task's log tail is printed.
    assert "disk on fire" in result.output


def test_parameters_and_outputs_flow_between_tasks(tmp_path: Path) -> None:
    received = tmp_path / "received"
    producer = container(
        "produce",
        WRITE_OUTPUT,
        "/tmp/outputs/message",
        "{{inputs.parameters.greeting}} from {{workflow.parameters.who}}",
        inputs={"parameters": [{"name": "greeting", "default": "hello"}]},
        outputs={
            "parameters": [
                {"name": "message", "valueFrom": {"path": "/tmp/outputs/message"}},
                {"name": "absent", "valueFrom": {"path": "/tmp/outputs/absent", "default": "fallback"}},
            ]
        },
    )
    consumer = container(
        "consume",
        APPEND,
        str(received),
        "{{inputs.parameters.message}}|{{inputs.parameters.absent}}|{{workflow.name}}|{{workflow.namespace}}",
        inputs={"parameters": [{"name": "message"}, {"name": "absent"}]},
    )
    manifest = workflow(
        [
            task("produce", "produce"),
            task(
                "consume",
                "consume",
                "produce",
                arguments={
                    "parameters": [
                        {"name": "message", "value": "{{tasks.produce.outputs.parameters.message}}"},
                        {"name": "absent", "value": "{{ tasks.produce.outputs.parameters.absent }}"},
                    ]
                },
                when="{{tasks.produce.status}} == Succeeded",
            ),
        ],
        [producer, consumer],
        arguments={"parameters": [{"name": "who", "value": "argo"}]},
    )
    result = run(manifest, tmp_path, parameters={"who": "local"})
    assert result.phase == "Succeeded", result.message
    assert result.nodes["produce"].outputs == {"message": "hello from local", "absent": "fallback"}
    assert lines(received) == [f"hello from local|fallback|{result.name}|local"]
    assert result.name.startswith("test-") and len(result.name) == len("test-") + 5
    status = json.loads((result.run_dir / "status.json").read_text())
    assert status["metadata"]["name"] == result.name
    assert status["status"]["phase"] == "Succeeded"
    node = status["status"]["nodes"]["produce"]
    assert node["outputs"]["parameters"] == [
        {"name": "message", "value": "hello from local"},
        {"name": "absent", "value": "fallback"},
    ]
    assert {"displayName", "templateName", "phase", "message", "exitCode", "startedAt", "finishedAt"} <= set(node)
    assert node["startedAt"].endswith("Z")
    assert (result.run_dir / "manifest.yaml").read_text().count("{{tasks.produce.outputs.parameters.message}}") == 1


def test_missing_output_fails_the_task_and_bad_reference_errors(tmp_path: Path) -> None:
    manifest = workflow(
        [task("silent", "silent"), task("bad-ref", "echo")],
        [
            container(
                "silent",
                "pass",
                outputs={"parameters": [{"name": "score", "valueFrom": {"path": "/tmp/outputs/score"}}]},
            ),
            container("echo", "print(1)", "{{workflow.parameters.nope}}"),
        ],
        parallelism=1,
    )
    manifest["spec"]["templates"][-1]["dag"]["failFast"] = False
    result = run(manifest, tmp_path)
    assert result.nodes["silent"].phase == "Failed"
    assert "/tmp/outputs/score" in result.nodes["silent"].message
    assert result.nodes["bad-ref"].phase == "Error"
    assert "{{workflow.parameters.nope}}" in result.nodes["bad-ref"].message
    assert result.phase == "Failed"


def test_retry_with_backoff_never_retries_exit_2(tmp_path: Path) -> None:
    retry = {
        "limit": "3",
        "retryPolicy": "OnFailure",
        "expression": "asInt(lastRetry.exitCode) != 2",
        "backoff": {"duration": "50ms", "factor": "2", "maxDuration": "1m"},
    }
    template = container(
        "flaky",
        EXIT_WITH,
        str(tmp_path / "{{inputs.parameters.code}}.attempts"),
        "{{inputs.parameters.code}}",
        inputs={"parameters": [{"name": "code"}]},
        retryStrategy=retry,
    )
    manifest = workflow(
        [task(f"exit-{c}", "flaky", arguments={"parameters": [{"name": "code", "value": c}]}) for c in ("1", "2")],
        [template],
    )
    result = run(manifest, tmp_path)
    assert len(lines(tmp_path / "1.attempts")) == 4  # the first attempt + limit retries
    assert len(lines(tmp_path / "2.attempts")) == 1  # bad input: never retried
    assert result.nodes["exit-1"].retries == 3
    assert result.nodes["exit-2"].retries == 0
    assert "not retried" in result.nodes["exit-2"].message
    assert result.nodes["exit-2"].exit_code == 2
    assert result.phase == "Failed"


def test_retry_policy_on_error_does_not_retry_a_failed_exit(tmp_path: Path) -> None:
    template = container(
        "t", EXIT_WITH, str(tmp_path / "attempts"), "1", retryStrategy={"limit": 2, "retryPolicy": "OnError"}
    )
    result = run(workflow([task("t", "t")], [template]), tmp_path)
    assert result.nodes["t"].phase == "Failed"
    assert len(lines(tmp_path / "attempts")) == 1


def test_template_deadline_kills_and_on_exit_sees_failure(tmp_path: Path) -> None:
    status_file = tmp_path / "exit-status"
    manifest = workflow(
        [task("hang", "hang"), task("later", "ok", "hang")],
        [
            container("hang", "import time; time.sleep(60)", activeDeadlineSeconds=1),
            container("ok", "print('ok')"),
            container("exit-handler", APPEND, str(status_file), "{{workflow.status}}"),
        ],
        onExit="exit-handler",
    )
    result = run(manifest, tmp_path)
    hang = result.nodes["hang"]
    assert hang.phase == "Failed"
    assert "activeDeadlineSeconds=1" in hang.message
    assert hang.exit_code == 143  # SIGTERM
    assert result.nodes["later"].phase == "Omitted"
    assert lines(status_file) == ["Failed"]
    assert result.nodes["onExit"].phase == "Succeeded"
    assert result.phase == "Failed"


def test_workflow_deadline_stops_running_tasks(tmp_path: Path) -> None:
    manifest = workflow(
        [task("hang", "hang"), task("later", "ok", "hang")],
        [container("hang", "import time; time.sleep(60)"), container("ok", "print('ok')")],
        activeDeadlineSeconds=1,
    )
    result = run(manifest, tmp_path)
    assert phases(result) == {"hang": "Failed", "later": "Omitted"}
    assert result.phase == "Failed"
    assert "activeDeadlineSeconds=1" in result.message


def test_resume_keeps_succeeded_tasks(tmp_path: Path) -> None:
    flag = tmp_path / "fixed"
    second = """
import pathlib, sys
open(sys.argv[1], 'a').write(sys.argv[3] + '\\n')
sys.exit(0 if pathlib.Path(sys.argv[2]).exists() else 1)
"""
    manifest = workflow(
        [
            task("first", "first"),
            task(
                "second",
                "second",
                "first",
                arguments={"parameters": [{"name": "v", "value": "{{tasks.first.outputs.parameters.v}}"}]},
            ),
        ],
        [
            container(
                "first",
                "import sys; open(sys.argv[1], 'a').write('x\\n'); open(sys.argv[2], 'w').write('from-first')",
                str(tmp_path / "first.runs"),
                "/tmp/outputs/v",
                outputs={"parameters": [{"name": "v", "valueFrom": {"path": "/tmp/outputs/v"}}]},
            ),
            container(
                "second",
                second,
                str(tmp_path / "second.runs"),
                str(flag),
                "{{inputs.parameters.v}}",
                inputs={"parameters": [{"name": "v"}]},
            ),
        ],
    )
    failed = run(manifest, tmp_path)
    assert phases(failed) == {"first": "Succeeded", "second": "Failed"}
    flag.touch()
    resumed = resume_workflow(failed.run_dir, cwd=tmp_path, console=Console(file=io.StringIO()))
    assert resumed.name == failed.name
    assert resumed.phase == "Succeeded"
    assert len(lines(tmp_path / "first.runs")) == 1
    assert lines(tmp_path / "second.runs") == ["from-first", "from-first"]
    assert resumed.nodes["first"].outputs == {"v": "from-first"}
    with pytest.raises(LocalExecutorError, match="already Succeeded"):
        resume_workflow(failed.run_dir, cwd=tmp_path, console=Console(file=io.StringIO()))


def test_volumes_map_to_host_folders(tmp_path: Path) -> None:
    write_and_report = (
        "import sys; open(sys.argv[1], 'w').write('data'); open(sys.argv[2], 'w').write('kept');"
        "open(sys.argv[3], 'w').write(sys.argv[1])"
    )
    read_back = "import sys; open(sys.argv[2], 'w').write(open(sys.argv[1]).read())"
    manifest = workflow(
        [
            task("write", "write"),
            task(
                "read",
                "read",
                "write",
                arguments={"parameters": [{"name": "path", "value": "{{tasks.write.outputs.parameters.path}}"}]},
            ),
        ],
        [
            container(
                "write",
                write_and_report,
                "/fsx/x",
                "/scratch/y",
                "/tmp/outputs/path",
                outputs={"parameters": [{"name": "path", "valueFrom": {"path": "/tmp/outputs/path"}}]},
            ),
            container(
                "read",
                read_back,
                "{{inputs.parameters.path}}",
                str(tmp_path / "copy"),
                inputs={"parameters": [{"name": "path"}]},
            ),
        ],
        volumes=[{"name": "fsx", "persistentVolumeClaim": {"claimName": "fsx-claim"}}],
    )
    templates = manifest["spec"]["templates"]
    for template in templates[:2]:
        template["container"]["volumeMounts"] = [{"name": "fsx", "mountPath": "/fsx"}]
    templates[0]["container"]["volumeMounts"].append({"name": "scratch", "mountPath": "/scratch"})
    templates[0]["volumes"] = [{"name": "scratch", "emptyDir": {}}]
    result = run(manifest, tmp_path)
    assert result.phase == "Succeeded", result.message
    assert (tmp_path / "state" / "volumes" / "fsx-claim" / "x").read_text() == "data"
    assert (result.run_dir / "volumes" / "scratch" / "y").read_text() == "kept"
    assert result.nodes["write"].outputs == {"path": "/fsx/x"}  # as Argo would show it
    assert (tmp_path / "copy").read_text() == "data"  # mapped again for the downstream task


INJECTION = {
    "triple-quote": "x''' + __import__('os').system('touch CANARY') + '''",
    "command-substitution": "$(touch CANARY)",
    "backticks": "`touch CANARY`",
    "semicolon": "a; touch CANARY",
    "newline": "line1\ntouch CANARY\n",
    "workflow-name": "{{workflow.name}}",
    "sprig": '{{=sprig.env("HOME")}}',
    "quotes": "\"double\" 'single' \\back",
    "non-ascii": "héllo ✓ 日本語 🚀",
}


def test_injection_corpus_reaches_the_step_byte_identical(tmp_path: Path) -> None:
    record = """
import os, pathlib, sys
out = pathlib.Path(sys.argv[1])
for i, value in enumerate(sys.argv[2:]):
    (out / f"arg{i}").write_bytes(os.fsencode(value))
    (out / f"env{i}").write_bytes(os.fsencode(os.environ[f"V{i}"]))
"""
    out = tmp_path / "seen"
    out.mkdir()
    names = list(INJECTION)
    template = container(
        "record",
        record,
        str(out),
        *(f"--value={{{{inputs.parameters.p{i}}}}}" for i in range(len(names))),
        inputs={"parameters": [{"name": f"p{i}"} for i in range(len(names))]},
    )
    template["container"]["env"] = [
        {"name": f"V{i}", "value": f"{{{{workflow.parameters.{n}}}}}"} for i, n in enumerate(names)
    ]
    manifest = workflow(
        [
            task(
                "record",
                "record",
                arguments={
                    "parameters": [
                        {"name": f"p{i}", "value": f"{{{{workflow.parameters.{n}}}}}"} for i, n in enumerate(names)
                    ]
                },
            )
        ],
        [template],
        arguments={"parameters": [{"name": n, "value": "placeholder"} for n in names]},
    )
    result = run(manifest, tmp_path, parameters=INJECTION)
    assert result.phase == "Succeeded", result.message
    for i, name in enumerate(names):
        assert (out / f"arg{i}").read_bytes() == f"--value={INJECTION[name]}".encode(), name
        assert (out / f"env{i}").read_bytes() == INJECTION[name].encode(), name
    assert not list(tmp_path.rglob("CANARY"))


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (
            lambda t: t.update(script={"image": "x", "source": "print(1)"}),
            r"spec.templates\[0\].script is not supported locally; use a container",
        ),
        (lambda t: t.update(resource={"action": "create"}), r"resource is not supported locally; a template is one"),
        (
            lambda t: t["container"].update(env=[{"name": "A", "valueFrom": {"secretKeyRef": {}}}]),
            r"env\[0\].valueFrom",
        ),
        (lambda t: t["container"].pop("command"), r"container.command is required"),
        (lambda t: t.update(retryStrategy={"retryPolicy": "Always"}), r"retryStrategy.limit is required"),
        (lambda t: t.update(retryStrategy={"limit": 1, "retryPolicy": "Sometimes"}), r"retryPolicy must be one of"),
        (
            lambda t: t["container"].update(volumeMounts=[{"name": "nope", "mountPath": "/x"}]),
            r"'nope' matches no volume",
        ),
    ],
    ids=["script", "container-and-resource", "env-valueFrom", "no-command", "no-limit", "bad-policy", "unknown-volume"],
)
def test_unsupported_templates_are_rejected_up_front(
    tmp_path: Path, mutate: Callable[[dict[str, Any]], object], message: str
) -> None:
    template = container("t", "print(1)")
    mutate(template)
    with pytest.raises(LocalExecutorError, match=message):
        run(workflow([task("t", "t")], [template]), tmp_path)
    assert not (tmp_path / "state").exists()  # nothing ran, nothing was written


@pytest.mark.parametrize(
    ("tasks", "message"),
    [
        ([task("a", "t", withSequence={"count": "2"})], r"withSequence is not supported locally; list the items"),
        ([task("a", "t", withItems=[1], withParam="[2]")], r"sets both withItems and withParam"),
        ([task("a", "t", "ghost")], r"depends on 'ghost'"),
        ([task("a", "t", "b"), task("b", "t", "a")], r"cycle"),
        ([task("a", "missing")], r"'missing' names no template in spec.templates"),
        (
            [task("a", "t"), task("b", "t", arguments={"parameters": [{"name": "x", "value": "{{tasks.a.status}}"}]})],
            r"does not depend on 'a'",
        ),
    ],
    ids=["withSequence", "two-loops", "unknown-dependency", "cycle", "missing-template", "undeclared-dependency"],
)
def test_invalid_dags_are_rejected(tmp_path: Path, tasks: list[dict[str, Any]], message: str) -> None:
    with pytest.raises(LocalExecutorError, match=message):
        run(workflow(tasks, [container("t", "print(1)")]), tmp_path)


def test_parameter_overrides_are_checked(tmp_path: Path) -> None:
    manifest = workflow(
        [task("t", "t")], [container("t", "print(1)")], arguments={"parameters": [{"name": "a", "value": "1"}]}
    )
    with pytest.raises(LocalExecutorError, match="unknown workflow parameter 'b'; known: a"):
        run(manifest, tmp_path, parameters={"b": "2"})


# `run` of the CLI on a one-task workflow; the task writes its pid to argv[2] and sleeps unless that file exists
# (so the resumed run succeeds at once). Like the train step committing a checkpoint, it takes 1 s to stop on SIGTERM.
RUN_CLI = """
import sys
from pathlib import Path
from hera.workflows import DAG, Container, Workflow
from rich.console import Console
from eksflow.run import execute

state_dir, pid_file, resume = sys.argv[1], sys.argv[2], sys.argv[3] or None
code = (
    "import os, pathlib, signal, sys, time; mark = pathlib.Path(sys.argv[1]); again = mark.exists(); "
    "mark.write_text(str(os.getpid())); "
    "signal.signal(signal.SIGTERM, lambda *_: (time.sleep(1), sys.exit(143))); time.sleep(0 if again else 60)"
)
with Workflow(name="sleepy", entrypoint="main") as workflow:
    hang = Container(name="hang", image="python:3.11", command=["python", "-c", code], args=[pid_file])
    with DAG(name="main"):
        hang()
sys.exit(execute(workflow.to_dict(), Path(state_dir), resume, Console(stderr=True, width=200), root=Path.cwd()))
"""


def test_ctrl_c_stops_the_run_with_one_line_and_it_resumes(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    repo = Path(__file__).resolve().parents[3]
    env = {**os.environ, "PYTHONPATH": str(repo)}

    def cli_run(resume: str = "") -> subprocess.Popen[str]:
        command = [sys.executable, "-c", RUN_CLI, str(tmp_path / "state"), str(pid_file), resume]
        return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    proc = cli_run()
    deadline = time.monotonic() + 30
    while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    step_pid = int(pid_file.read_text())
    proc.send_signal(signal.SIGINT)  # what Ctrl-C sends to the foreground process
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)  # an impatient second Ctrl-C while the task is still stopping
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
    assert stderr.splitlines()[-1] == "interrupted: workflow sleepy stopped; resume with: --resume sleepy"
    status = json.loads((tmp_path / "state" / "runs" / "sleepy" / "status.json").read_text())
    assert status["status"]["phase"] == "Failed"
    assert status["status"]["message"] == "interrupted"
    assert status["status"]["nodes"]["hang"]["phase"] == "Failed"
    assert status["status"]["nodes"]["hang"]["message"] == "interrupted"
    with pytest.raises(ProcessLookupError):
        os.kill(step_pid, 0)

    resumed = cli_run("sleepy")
    _, stderr = resumed.communicate(timeout=60)
    assert resumed.returncode == 0, stderr
    status = json.loads((tmp_path / "state" / "runs" / "sleepy" / "status.json").read_text())
    assert status["status"]["phase"] == "Succeeded"


def test_a_program_that_is_not_there_is_an_error_not_a_failure(tmp_path: Path) -> None:
    template = {"name": "t", "container": {"image": "x", "command": ["no-such-program-here", "--flag"]}}
    template["retryStrategy"] = {"limit": 1, "retryPolicy": "OnError"}
    result = run(workflow([task("t", "t")], [template]), tmp_path)
    node = result.nodes["t"]
    assert (node.phase, node.exit_code, node.retries) == ("Error", None, 1)  # OnError retries what could not start
    assert node.message.startswith("cannot start 'no-such-program-here': [Errno 2] No such file or directory")
