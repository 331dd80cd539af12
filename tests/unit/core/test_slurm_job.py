"""How a Slurm job's end becomes the task's exit code, and what the job is made of (eksflow.runtime.slurm_job)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from eksflow.runtime import slurm_job
from eksflow.runtime.slurm import JobStatus

UID = "5f0c6a8e-2b1d-4c3e-9a7f-0123456789ab"  # the workflow's uid, as {{workflow.uid}} gives it


def own_argv(tmp_path, **extra):
    """slurm_job's own arguments, as the Slurm launcher renders them (`extra` added or replacing one)."""
    given = {
        "url": "http://127.0.0.1:6820",
        "token_file": tmp_path / "token",
        "job_name": "llama-lora-x7k2-train",
        "workflow_uid": UID,
        "work_dir": tmp_path / "work",
        "outputs_dir": tmp_path / "outputs",
        **extra,
    }
    return [f"--{k.replace('_', '-')}={v}" for k, v in given.items()]


def args(tmp_path, **extra):
    return slurm_job.JobArgs.from_argv(own_argv(tmp_path, **extra))


def ended(state: str, exit_code: int | None = 0) -> JobStatus:
    return JobStatus(job_id=7, name="x", state=state, exit_code=exit_code, restarts=0)


@pytest.mark.parametrize(
    ("state", "exit_code", "expected"),
    [
        ("FAILED", 2, 2),  # the step refused its input: never retried
        ("FAILED", 1, 1),
        ("CANCELLED", 143, 1),
        ("PREEMPTED", None, 143),
        ("NODE_FAIL", None, 143),
        ("BOOT_FAIL", None, 143),
        ("OUT_OF_MEMORY", None, 1),
    ],
)
def test_each_end_state_maps_to_the_exit_contract(tmp_path, state, exit_code, expected):
    assert slurm_job.finish(args(tmp_path), ended(state, exit_code), tmp_path / "work" / "outputs") == expected


def test_a_completed_job_hands_the_steps_outputs_to_the_task(tmp_path):
    outputs = tmp_path / "work" / "outputs"
    outputs.mkdir(parents=True)
    (outputs / "final_loss").write_text("1.25")
    (outputs / "adapter_dir").write_text("/fsx/runs/x/train/adapter")
    assert slurm_job.finish(args(tmp_path), ended("COMPLETED"), outputs) == 0
    assert {p.name: p.read_text() for p in (tmp_path / "outputs").iterdir()} == {
        "final_loss": "1.25",
        "adapter_dir": "/fsx/runs/x/train/adapter",
    }


def test_a_timeout_is_retried_once_then_refused_naming_the_setting(tmp_path, capsys):
    a = args(tmp_path)
    (tmp_path / "work").mkdir()
    assert slurm_job.finish(a, ended("TIMEOUT", None), tmp_path / "work" / "outputs") == 1
    assert slurm_job.finish(a, ended("TIMEOUT", None), tmp_path / "work" / "outputs") == 2
    assert "cluster.slurm.time_limit_min" in capsys.readouterr().err


def test_the_script_is_a_constant_and_the_steps_argv_travels_as_json(tmp_path):
    hostile = "--run-name=$(touch /tmp/pwn); `id` \\n 'x'"
    spec = slurm_job.spec(
        args(tmp_path, nodes=2, tasks_per_node=4, gpus_per_node=4), ["eksflow.llm.steps.train", hostile], tmp_path
    )
    assert spec.script == slurm_job.SCRIPT  # nothing of the step or its values in the batch script
    argv = json.loads(spec.environment[slurm_job.ARGV_ENV])
    assert argv == [sys.executable, "-m", "eksflow.llm.steps.train", hostile, f"--outputs-dir={tmp_path}"]
    assert (spec.nodes, spec.tasks_per_node, spec.gpus_per_node) == (2, 4, 4)
    assert spec.environment["PATH"] == os.environ.get("PATH", "/usr/bin:/bin")


@pytest.mark.parametrize("argv", [[], ["--dataset-dir=/x"], ["eksflow/llm/steps/train.py"]])
def test_a_missing_or_malformed_step_module_is_refused(tmp_path, argv):
    (tmp_path / "token").write_text("t")
    with pytest.raises(slurm_job.StepInputError, match="give the step module"):
        slurm_job.run(args(tmp_path), argv)


def test_the_token_file_missing_is_one_line_naming_the_secret(tmp_path, capsys):
    own = own_argv(tmp_path, token_file=tmp_path / "absent", url="http://127.0.0.1:1")
    assert slurm_job.main([*own, "--", "eksflow.llm.steps.train"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "mount the Slurm token Secret" in err


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("time-limit-min", "true"),  # a bool is no number of minutes
        ("time-limit-min", str(10**23)),  # beyond Slurm's uint32 minutes
        ("time-limit-min", "600.5"),
        ("time-limit-min", "-1"),
        ("url", "http://slurmrestd:99999"),
        ("url", "http://-:6820"),
        ("url", "http://slurmrestd:6820/x?y"),
        ("workflow-uid", "{{workflow.uid}}"),  # never substituted: not a uid
        ("forward-env", '["WANDB PROJECT"]'),
    ],
    ids=["bool", "1e23", "fraction", "negative", "port", "host", "path", "uid", "env-name"],
)
def test_each_bad_argument_is_one_line_naming_its_flag(tmp_path, capsys, flag, value):
    own = own_argv(tmp_path, **{flag.replace("-", "_"): value})
    assert slurm_job.main([*own, "--", "eksflow.llm.steps.train"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"error: --{flag}: "), err
    assert "pydantic" not in err and "validation error" not in err


@pytest.mark.parametrize("secret", ["HF_TOKEN", "AWS_SECRET_ACCESS_KEY", "MLFLOW_TRACKING_TOKEN"])
def test_a_credential_is_never_forwarded_even_when_named(tmp_path, capsys, secret):
    own = own_argv(tmp_path, forward_env=json.dumps(["WANDB_PROJECT", secret]))
    assert slurm_job.main([*own, "--", "eksflow.llm.steps.train"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"error: --forward-env: Value error, {secret} is a credential")


def test_the_job_gets_the_named_variables_and_no_credential(tmp_path, monkeypatch):
    """HF_* once matched a prefix: an exported HF_TOKEN landed in slurmctld's job record."""
    exported = {
        "HF_TOKEN": "hf_secret_value",
        "AWS_SECRET_ACCESS_KEY": "aws-secret-value",
        "MLFLOW_TRACKING_TOKEN": "mlflow-secret-value",
        "EKSFLOW_VLLM_API_KEY": "vllm-secret-value",
        "NCCL_SOCKET_IFNAME": "eth0",  # not named by the launcher: not the job's
        "WANDB_PROJECT": "llama-lora",  # the pipeline's env
        "HF_HUB_OFFLINE": "1",  # the profile's
        "HOME": "/home/step",
    }
    for name, value in exported.items():
        monkeypatch.setenv(name, value)
    a = args(tmp_path, forward_env=json.dumps(["HF_HUB_OFFLINE", "WANDB_PROJECT", "NOT_SET_HERE"]))
    environment = slurm_job.spec(a, ["eksflow.llm.steps.train"], tmp_path).environment
    assert {"WANDB_PROJECT": "llama-lora", "HF_HUB_OFFLINE": "1", "HOME": "/home/step"}.items() <= environment.items()
    assert not {"HF_TOKEN", "AWS_SECRET_ACCESS_KEY", "MLFLOW_TRACKING_TOKEN", "EKSFLOW_VLLM_API_KEY"} & set(environment)
    assert "NCCL_SOCKET_IFNAME" not in environment and "NOT_SET_HERE" not in environment
    assert not [v for v in environment.values() if "secret-value" in v or "secret_value" in v]


def test_the_job_is_marked_with_the_workflows_uid(tmp_path):
    spec = slurm_job.spec(args(tmp_path), ["eksflow.llm.steps.train"], tmp_path)
    assert spec.comment == slurm_job.job_comment(UID) and UID in spec.comment


def test_a_refusal_on_any_task_is_bad_input_though_srun_ends_with_the_others_143(tmp_path):
    """srun --kill-on-bad-exit terminates the other tasks when one exits 2, and srun's exit is then 143."""
    a = args(tmp_path)
    (tmp_path / "work").mkdir()
    assert slurm_job.finish(a, ended("FAILED", 143), tmp_path / "work" / "outputs") == 1
    slurm_job.refused_file(a).touch()
    assert slurm_job.finish(a, ended("FAILED", 143), tmp_path / "work" / "outputs") == 2


def task(tmp_path, code: str) -> tuple[int, bool]:
    """(exit code, whether the refusal file was written) of one task running `python -c code` as its step."""
    refused = tmp_path / "refused-input"
    step = json.dumps([sys.executable, "-c", code])
    env = {**os.environ, "EKSFLOW_STEP_ARGV": step, "EKSFLOW_REFUSED_FILE": str(refused)}
    done = subprocess.run([sys.executable, "-m", "eksflow.runtime.slurm_task"], env=env, timeout=60, check=False)
    return done.returncode, refused.exists()


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("import sys; sys.exit(2)", (2, True)),  # the step refused its input: the task says so
        ("import sys; sys.exit(1)", (1, False)),
        ("pass", (0, False)),
        ("import os, signal; os.kill(os.getpid(), signal.SIGTERM)", (143, False)),  # as srun reports a signal
    ],
)
def test_a_task_ends_as_its_step_did_and_records_a_refusal(tmp_path, code, expected):
    assert task(tmp_path, code) == expected


def rendezvous(tmp_path, job_id: int, **env: str) -> tuple[str, str]:
    """(MASTER_ADDR, MASTER_PORT) the job's script gives its ranks, run by bash with scontrol and srun stand-ins."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    # A node list written in two writes, a moment apart, as a long one is: the script must read it all.
    hostnames = "echo node-a && sleep 0.1 && echo node-b"
    scontrol = f'if [ "$2" = hostnames ]; then {hostnames}; else echo "NodeName=node-a NodeAddr=10.0.0.7 x=y"; fi'
    (bin_dir / "scontrol").write_text(f"#!/bin/sh\n{scontrol}\n")
    (bin_dir / "srun").write_text('#!/bin/sh\necho "$MASTER_ADDR $MASTER_PORT"\n')
    for tool in ("scontrol", "srun"):
        (bin_dir / tool).chmod(0o755)
    environ = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "SLURM_JOB_ID": str(job_id),
        "SLURM_JOB_NODELIST": "node-[a-b]",
        slurm_job.PYTHON_ENV: "python3",
    }
    done = subprocess.run(
        ["bash", "-c", slurm_job.SCRIPT], env={**environ, **env}, capture_output=True, text=True, check=True
    )
    address, port = done.stdout.split()
    return address, port


def test_jobs_packed_on_one_node_meet_on_ports_of_their_own(tmp_path):
    """Two jobs on one node once both bound rank 0's TCPStore to 29500: the second failed with EADDRINUSE."""
    first, second = rendezvous(tmp_path, 41), rendezvous(tmp_path, 42)
    assert first == ("10.0.0.7", "20041") and second == ("10.0.0.7", "20042")
    assert rendezvous(tmp_path, 123456)[1] == "23456"  # below Linux's ephemeral ports (32768 and up)
    assert rendezvous(tmp_path, 41, MASTER_PORT="29400")[1] == "29400"  # a port the user set is kept


class ScriptedSlurm:
    """One job's statuses, one per look, and the progress its step has written by then; what the task showed."""

    def __init__(self, looks: list[tuple[JobStatus, str]], job_progress: Path, task_progress: Path) -> None:
        self.looks = looks
        self.job_progress, self.task_progress = job_progress, task_progress
        self.shown: list[str] = []  # the task's progress file at each look: what it copied after the previous one

    def status(self, job_id: int) -> JobStatus:
        self.shown.append(self.task_progress.read_text() if self.task_progress.exists() else "")
        status, done = self.looks.pop(0)
        self.job_progress.write_text(done)
        return status


def look(state: str, restarts: int, reason: str = "", nodes: str = "") -> JobStatus:
    return JobStatus(job_id=7, name="x", state=state, exit_code=0, restarts=restarts, reason=reason, nodes=nodes)


def test_a_requeue_is_told_and_kept_as_an_output_and_the_steps_progress_is_the_tasks(tmp_path, monkeypatch, capsys):
    """A node lost mid-training: Slurm requeued the job under its id and the step resumed. The task told it in its
    log only (its outputs, `get` and the report showed a plain success) and showed no N/M of the step's."""
    task_progress = tmp_path / "task-progress"
    monkeypatch.setenv("ARGO_PROGRESS_FILE", str(task_progress))
    job_progress = tmp_path / "work" / "progress"
    job_progress.parent.mkdir()
    # as Slurm 22.05 showed a job whose node went DOWN (measured): PENDING at once, its restart count raised
    looks = [
        (look("RUNNING", 0, "None", "slurm-node-[1-2]"), "3/12"),
        (look("PENDING", 1, "BeginTime"), "4/12"),
        (look("RUNNING", 1, "None", "slurm-node-[1,3]"), "9/12"),
        (look("COMPLETED", 1, "None", "slurm-node-[1,3]"), "12/12"),
    ]
    slurm = ScriptedSlurm(looks, job_progress, task_progress)
    followed = slurm_job.follow(slurm, 7, tmp_path / "slurm.out", 0.001, job_progress)  # type: ignore[arg-type]
    assert slurm.shown == ["", "3/12", "4/12", "9/12"] and task_progress.read_text() == "12/12"
    assert followed.requeues == ("restart 1: ran on slurm-node-[1-2]; reason BeginTime",)
    told = capsys.readouterr().err
    assert "Slurm job 7 requeued (restart 1: ran on slurm-node-[1-2]; reason BeginTime): the step resumes" in told

    (tmp_path / "work" / "outputs").mkdir()
    assert slurm_job.finish(args(tmp_path), followed.status, tmp_path / "work" / "outputs", followed.requeues) == 0
    assert (tmp_path / "outputs" / slurm_job.REQUEUES_OUTPUT).read_text() == (
        "1 (Slurm job 7: restart 1: ran on slurm-node-[1-2]; reason BeginTime; the step resumed from its checkpoint)"
    )


def test_the_job_writes_its_progress_where_the_task_reads_it(tmp_path):
    spec = slurm_job.spec(args(tmp_path), ["eksflow.llm.steps.train"], tmp_path)
    assert spec.environment["ARGO_PROGRESS_FILE"] == str(tmp_path / "work" / "progress")
