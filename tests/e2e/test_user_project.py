"""A user's own project (tests/fixtures/greeter: its own `pipelines` and `steps` packages) runs with eksflow as is."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROJECT = ROOT / "tests" / "fixtures" / "greeter"


def cli(*args: str, cwd: Path = PROJECT, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args],
        check=False,
        cwd=cwd,
        env=env or dict(os.environ),
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_user_pipeline_runs_its_own_steps_locally(tmp_path):
    done = cli("-m", "pipelines.hello", "run", "--state-dir", str(tmp_path), "--set", "who=Grace")
    assert done.returncode == 0, done.stderr
    (run,) = (tmp_path / "runs").iterdir()
    status = json.loads((run / "status.json").read_text())["status"]
    assert status["phase"] == "Succeeded"
    outputs = {
        node["displayName"]: {p["name"]: p["value"] for p in node["outputs"]["parameters"]}
        for node in status["nodes"].values()
        if node.get("outputs")
    }
    assert outputs["combine"] == {"line": "Hello, Grace! / Bonjour, Grace!", "longest": "second"}
    assert outputs["greet-en"]["length"] == "13"


def test_the_pipeline_file_runs_from_anywhere_with_its_project_on_the_path(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(PROJECT)}
    done = cli(str(PROJECT / "pipelines" / "hello.py"), "render", cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    assert "steps.greet" in done.stdout and "eksflow.dev/pipeline: hello" in done.stdout


def test_a_bad_user_setting_is_one_line_and_exit_2(tmp_path):
    done = cli("-m", "pipelines.hello", "run", "--state-dir", str(tmp_path), "--set", "greeting.punctuation=!!!!")
    assert done.returncode == 2
    assert done.stderr.strip().startswith("config error: greeting.punctuation: String should have at most 3")
    assert not (tmp_path / "runs").exists()


HOSTILE = {
    "quotes": "'''\"\"\"",
    "command": "$(touch /tmp/eksflow-pwn-run) `touch /tmp/eksflow-pwn-run`; rm -rf / && echo",
    "newline": "first line\nsecond line",
    "unicode": "naïve café ✓ 日本語",
    "flag": "--outputs-dir=/etc",
    "path-text": "Copy /fsx/data to /fsx/other",
}


def test_hostile_values_reach_steps_intact(tmp_path):
    """S1 through the local executor: each value arrives byte-identical; no command in it ever runs."""
    for case, value in HOSTILE.items():
        state = tmp_path / case
        done = cli("-m", "pipelines.hello", "run", "--state-dir", str(state), "--set", f"who={value}")
        assert done.returncode == 0, f"{case}: {done.stderr}"
        (run,) = (state / "runs").iterdir()
        nodes = json.loads((run / "status.json").read_text())["status"]["nodes"]
        line = next(
            p["value"]
            for n in nodes.values()
            if n["displayName"] == "combine"
            for p in n["outputs"]["parameters"]
            if p["name"] == "line"
        )
        assert line == f"Hello, {value}! / Bonjour, {value}!", case
    assert not Path("/tmp/eksflow-pwn-run").exists()


def verb(*args: str, state: Path) -> subprocess.CompletedProcess[str]:
    return cli("-m", "pipelines.hello", *args, "--state-dir", str(state))


def test_the_argo_verbs_on_finished_failed_and_running_runs(tmp_path):
    state = tmp_path / "state"
    assert verb("run", state=state).returncode == 0
    failed = verb("run", "--set", "second_language=xx", state=state)
    assert failed.returncode == 1
    assert "greet-fr failed on bad input (exit 2): fix it, then start a new run" in failed.stderr
    listed = verb("list", state=state)
    rows = [line.split() for line in listed.stdout.splitlines()[1:]]
    assert sorted(row[1] for row in rows) == ["Failed", "Succeeded"]
    good = next(row[0] for row in rows if row[1] == "Succeeded")
    bad = next(row[0] for row in rows if row[1] == "Failed")

    got = verb("get", good, state=state)
    assert got.returncode == 0 and "line = Hello, Ada! / Bonjour, Ada!" in got.stdout
    got = verb("get", bad, state=state)
    assert got.returncode == 1 and "greet-fr  Failed" in got.stdout and "--language='xx'" in got.stdout
    logs = verb("logs", bad, "greet-fr", state=state)
    assert logs.returncode == 0 and "error: --language='xx': use one of en, fr, de" in logs.stdout

    retried = verb("retry", bad, "-p", "who=Ida", state=state)  # the bad input stays: it fails the same way
    assert retried.returncode == 1
    resubmitted = verb("resubmit", good, "-p", "who=Ida", state=state)
    assert resubmitted.returncode == 0 and "line = Hello, Ida! / Bonjour, Ida!" in resubmitted.stderr
    assert verb("get", "no-such-run", state=state).returncode == 2

    slow = subprocess.Popen(
        [sys.executable, "-m", "pipelines.hello", "run", "--state-dir", str(state), "--set", "greeting.pause_s=8"],
        cwd=PROJECT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        running = []
        while not running and time.monotonic() < deadline:
            running = [line for line in verb("list", state=state).stdout.splitlines() if " Running " in line]
            time.sleep(0.5)
        assert running, "the slow run never showed up as Running"
        name = running[0].split()[0]
        followed = verb("logs", name, "greet-en", "--follow", state=state)  # returns when the task ends
        assert followed.returncode == 0 and "[greet] 1/1" in followed.stdout
    finally:
        slow.communicate(timeout=120)
    assert slow.returncode == 0


def test_a_run_started_with_a_config_resumes_with_its_own_inputs(tmp_path):
    state = tmp_path / "state"
    config = tmp_path / "grace.yaml"
    config.write_text("who: Grace\ngreeting:\n  pause_s: 2\n")
    started = subprocess.Popen(
        [sys.executable, "-m", "pipelines.hello", "run", "--state-dir", str(state), "--config", str(config)],
        cwd=PROJECT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not list((state / "runs").glob("*/tasks/*/progress")):
        time.sleep(0.2)  # a greeting has started
    started.send_signal(signal.SIGTERM)
    _, stderr = started.communicate(timeout=120)
    assert started.returncode == 143, stderr
    advice = next(line for line in stderr.splitlines() if "resume with: --resume" in line)
    name = advice.rsplit(" ", 1)[-1]

    run_again = ["-m", "pipelines.hello", "run", "--state-dir", str(state), "--resume", name]
    changed = cli(*run_again, "--config", str(config), "--set", "who=Ada")
    assert changed.returncode == 2
    assert f'run {name!r} started with other settings: who ("Grace" -> "Ada")' in changed.stderr

    same = cli(*run_again, "--config", str(config), "--set", "greeting.pause_s=30")
    assert same.returncode == 2 and "greeting.pause_s (2.0 -> 30.0)" in same.stderr
    resumed = cli(*run_again)  # the command it printed
    assert resumed.returncode == 0, resumed.stderr
    assert "line = Hello, Grace! / Bonjour, Grace!" in resumed.stderr


def test_new_parameter_values_are_checked_by_the_steps_rules_before_a_new_run(tmp_path):
    state = tmp_path / "state"
    done = cli("-m", "pipelines.hello", "run", "--state-dir", str(state), "--set", "second_language=xx")
    assert done.returncode == 1  # greet-fr fails: a run to retry
    (name,) = [p.name for p in (state / "runs").iterdir()]
    for command, parameter, why in [
        ("retry", "who=", "-p who='': steps.greet --name: String should have at least 1 character"),
        ("resubmit", "who=", "-p who='': steps.greet --name: String should have at least 1 character"),
        ("retry", "nobody=1", "-p nobody: the workflow has no parameter 'nobody'"),
    ]:
        refused = verb(command, name, "-p", parameter, state=state)
        assert refused.returncode == 2, refused.stderr
        assert why in refused.stderr and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert [p.name for p in (state / "runs").iterdir()] == [name]  # no new run started
