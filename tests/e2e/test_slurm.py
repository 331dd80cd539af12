"""The train step as a real Slurm batch job across two nodes, submitted and followed through a real slurmrestd.

A two-node Slurm 22.05 runs on this machine for the module (scripts/local_slurm.py --nodes 2: munge, slurmctld and
slurmrestd here, a slurmd on each of two simulated nodes with its own address and host name, ports of their own,
everything in a temporary folder); where it cannot (not root, no apt-get) the module skips with the reason.
eksflow.runtime.slurm_job submits the job, follows it, copies its outputs and ends with the exit contract; the job
runs `python -m eksflow.llm.steps.train --launcher=mpi` as one srun task per node (DDP over gloo between the nodes'
addresses) on the session's tiny random Llama. What the job was given is read where slurmctld keeps it: the job
list's user and comment, and the environment file of its state folder.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from eksflow.llm.steps.common import checkpoints
from eksflow.llm.steps.train.state import read_metrics
from eksflow.runtime.ports import free_port
from eksflow.runtime.slurm import JobStatus, SlurmApi, SlurmError, slurm_api
from eksflow.runtime.slurm_job import job_comment
from tests.e2e.conftest import training_folder

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = [sys.executable, str(ROOT / "scripts" / "local_slurm.py")]
UID = "5f0c6a8e-2b1d-4c3e-9a7f-0123456789ab"  # the workflow's, as Argo's {{workflow.uid}} gives it
pytestmark = pytest.mark.slow


class Slurm:
    """The module's cluster: its environment, its REST client, and a way to wait for a job's state."""

    def __init__(self, folder: Path, env: dict[str, str]) -> None:
        self.folder = folder
        self.env = env
        self.url = env["EKSFLOW_SLURM_URL"]
        self.token_file = Path(env["EKSFLOW_SLURM_TOKEN_FILE"])
        self.api: SlurmApi = slurm_api("v0.0.38", self.url, user="root", token=self.token_file.read_text())

    def job(self, name: str) -> JobStatus:
        (found,) = [job for job in self.api.jobs() if job.name == name]
        return found

    def wait(self, name: str, state: str, timeout_s: float = 300) -> JobStatus:
        deadline = time.monotonic() + timeout_s
        while True:
            jobs = [job for job in self.api.jobs() if job.name == name]
            if jobs and jobs[-1].state == state:
                return jobs[-1]
            assert time.monotonic() < deadline, f"{name} never {state}: {jobs}"
            time.sleep(0.5)

    def scontrol(self, *args: str) -> str:
        return subprocess.run(["scontrol", *args], env=self.env, capture_output=True, text=True, check=True).stdout

    def environment(self, job_id: int) -> dict[str, str]:
        """The job's environment as slurmctld keeps it (StateSaveLocation: a count, then NUL-ended NAME=value)."""
        record = (self.folder / "state" / f"hash.{job_id % 10}" / f"job.{job_id}" / "environment").read_bytes()
        entries = record[4:].decode().split("\0")
        return dict(entry.split("=", 1) for entry in entries if entry)


@pytest.fixture(scope="module")
def slurm() -> Iterator[Slurm]:
    # Not under pytest's folder: slurmrestd runs as nobody, and pytest's temporary folders are closed to others.
    folder = Path(tempfile.mkdtemp(prefix="eksflow-slurm-"))
    env = {
        **os.environ,
        "EKSFLOW_SLURM_DIR": str(folder),
        "EKSFLOW_STATE_DIR": str(folder / "state"),  # where `up` leaves the token Secret for local runs
        "EKSFLOW_SLURM_CTLD_PORT": str(free_port()),
        "EKSFLOW_SLURM_SLURMD_PORT": str(free_port()),
        "EKSFLOW_SLURM_REST_PORT": str(free_port()),
    }
    up = [*SCRIPT, "up", "--nodes=2"]
    started = subprocess.run(up, check=False, env=env, capture_output=True, text=True, timeout=900)
    if started.returncode == 3:
        pytest.skip(started.stderr.strip())
    assert started.returncode == 0, started.stderr
    env.update(line.split("=", 1) for line in started.stdout.splitlines() if "=" in line)
    env["GLOO_SOCKET_IFNAME"] = "eth0"  # what the profile gives a job of several nodes (profiles.env)
    cluster = Slurm(folder, env)
    try:
        yield cluster
    finally:
        with contextlib.suppress(SlurmError):  # a failed test's job must not outlive the daemons (its steps would)
            deadline = time.monotonic() + 60
            while (running := [job for job in cluster.api.jobs() if not job.ended]) and time.monotonic() < deadline:
                for job in running:
                    cluster.api.cancel(job.job_id)
                time.sleep(1)
        subprocess.run([*SCRIPT, "down"], check=False, env=env, capture_output=True, timeout=120)
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, tiny_llama) -> Path:
    return training_folder(tmp_path_factory.mktemp("slurm-train"), tiny_llama)


def train_argv(workdir: Path, out: Path, max_steps: int, **extra: object) -> list[str]:
    settings = {
        "dataset-dir": workdir / "data",
        "base-model": workdir / "model",
        "output-dir": out,
        "run-name": out.name,
        "max-steps": max_steps,
        "max-seq-len": 64,
        "micro-batch-size": 2,
        "checkpoint-every": 1,
        "log-every": 1,
        "num-workers": 2,
        "cpus-per-worker": 1,
        "strategy": "ddp",
        "precision": "fp32",
        "launcher": "mpi",
        "token-cache-dir": workdir / "token-cache",
        **extra,
    }
    return ["eksflow.llm.steps.train", *(f"--{name}={value}" for name, value in settings.items())]


def submitter(
    slurm: Slurm, name: str, work: Path, step_argv: list[str], progress: Path | None = None, **extra: object
) -> subprocess.Popen[str]:
    """`python -m eksflow.runtime.slurm_job ... -- <step argv>`, as the Argo task runs it (`progress`: its
    $ARGO_PROGRESS_FILE)."""
    own = {
        "url": slurm.url,
        "token-file": slurm.token_file,
        "job-name": name,
        "workflow-uid": UID,
        "work-dir": work / "slurm",
        "nodes": 2,
        "tasks-per-node": 1,
        "forward-env": '["GLOO_SOCKET_IFNAME"]',
        "outputs-dir": work / "task-outputs",
        "poll-s": 0.5,
        **extra,
    }
    argv = [sys.executable, "-m", "eksflow.runtime.slurm_job", *(f"--{k}={v}" for k, v in own.items()), "--"]
    env = {**slurm.env, "ARGO_PROGRESS_FILE": str(progress)} if progress else slurm.env
    return subprocess.Popen(
        [*argv, *step_argv], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def test_the_train_step_runs_as_a_slurm_job_and_its_outputs_reach_the_task(slurm, workdir, tmp_path):
    """Preference tuning (method=dpo) on pairs, as a 2-node Slurm job: the step's outputs reach the Argo task."""
    pairs = tmp_path / "pairs"
    pairs.mkdir()
    rows = [{"prompt": f"What is {i} plus {i}?", "chosen": f"{2 * i}.", "rejected": f"{2 * i + 1}."} for i in range(8)]
    (pairs / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    dpo = {"dataset-dir": pairs, "method": "dpo"}
    task = submitter(slurm, "train-ok", tmp_path, train_argv(workdir, tmp_path / "train", 3, **dpo))
    log, _ = task.communicate(timeout=600)
    assert task.returncode == 0, log
    job = slurm.job("train-ok")
    assert job.state == "COMPLETED" and job.exit_code == 0
    outputs = {p.name: p.read_text() for p in (tmp_path / "task-outputs").iterdir()}
    assert {"adapter_dir", "checkpoint_dir", "final_loss", "tokens_per_s"} <= set(outputs), outputs
    assert Path(outputs["adapter_dir"], "adapter_config.json").is_file()
    assert "strategy: ddp" in log, log
    assert f"submitted Slurm job {job.job_id}" in log and "COMPLETED" in log
    assert slurm.token_file.read_text() not in log


def test_a_lost_node_requeues_the_job_which_resumes_from_its_checkpoint_on_the_replacement(
    slurm, workdir, tmp_path, capsys
):
    """The node-down drill: a node lost mid-training (every process on it killed, its address gone) is set DOWN,
    as slurmctld does once it stops answering; Slurm requeues the job (NODE_FAIL, JobRequeue=1) under the same id,
    the replacement slurmd registers (ReturnToService=2), and the job starts again by itself: both srun tasks resume
    from the last committed checkpoint, and the task follows the job throughout: its progress is the step's, and it
    says the requeue in its log and in its `slurm_requeues` output (what `get` and the report show)."""
    out, every, steps = tmp_path / "train", 2, 12
    progress = tmp_path / "task-progress"
    argv = train_argv(workdir, out, steps, **{"checkpoint-every": every})
    task = submitter(slurm, "train-node-lost", tmp_path, argv, progress=progress)
    lines: list[tuple[float, str]] = []
    reader = threading.Thread(target=lambda: lines.extend((time.monotonic(), line) for line in task.stdout or []))
    reader.start()
    job = slurm.wait("train-node-lost", "RUNNING")
    deadline = time.monotonic() + 300
    while not checkpoints.committed(out / "checkpoints"):
        assert time.monotonic() < deadline and task.poll() is None, "".join(line for _, line in lines)
        time.sleep(0.05)
    lost_at = time.monotonic()
    shown_before_loss = progress.read_text() if progress.exists() else ""
    subprocess.run([*SCRIPT, "lose", "slurm-node-2"], env=slurm.env, check=True, capture_output=True, timeout=60)
    done = checkpoints.committed(out / "checkpoints")[-1].step  # no rank commits without its peer on the lost node
    slurm.wait("train-node-lost", "PENDING", timeout_s=60)  # requeued, waiting for two nodes
    subprocess.run([*SCRIPT, "up", "--nodes=2"], env=slurm.env, check=True, capture_output=True, timeout=120)
    assert task.wait(600) == 0, "".join(line for _, line in lines)
    reader.join(10)
    log = "".join(line for _, line in lines)
    assert slurm.job("train-node-lost").job_id == job.job_id and slurm.job("train-node-lost").restarts == 1
    # one rank per node, each at its node's address, before and after the loss
    ranks = set(re.findall(r"rank (\d)/2: host (\S+ \S+)", log))
    nodes = dict(entry.split("@") for entry in slurm.env["EKSFLOW_SLURM_NODES"].split(","))
    assert ranks == {("0", f"slurm-node-1 {nodes['slurm-node-1']}"), ("1", f"slurm-node-2 {nodes['slurm-node-2']}")}
    resumed = {int(r): int(s) for r, s in re.findall(r"rank (\d): resumed from \S+ \(step (\d+)\)", log)}
    assert set(resumed) == {0, 1} and len(set(resumed.values())) == 1, log[-3000:]
    assert resumed[0] == done  # the newest commit: at most the steps since it were lost (fewer than `every`)
    back_at = next(at for at, line in lines if "resumed from" in line)
    committed = checkpoints.committed(out / "checkpoints")
    assert committed[-1].step == steps and 0 < read_metrics(committed[-1].path)["loss"] < 20
    # the step's progress was the task's before the loss and at the end (the live table's N/M)
    assert re.fullmatch(rf"\d+/{steps}", shown_before_loss) and progress.read_text() == f"{steps}/{steps}"
    requeued = (tmp_path / "task-outputs" / "slurm_requeues").read_text()
    assert requeued.startswith(f"1 (Slurm job {job.job_id}: restart 1: ran on slurm-node-"), requeued
    assert f"Slurm job {job.job_id} requeued (restart 1: " in log
    with capsys.disabled():
        print(f"\nthe task's slurm_requeues output: {requeued}")
        print(
            f"\nSlurm node lost after checkpoint step {done}: the requeued job resumed from step {resumed[0]} "
            f"{back_at - lost_at:.0f} s after the loss (the requeue hold, the replacement's registration, the ranks' "
            "start)"
        )


def test_interrupting_the_task_cancels_the_job(slurm, workdir, tmp_path):
    task = submitter(slurm, "train-stop", tmp_path, train_argv(workdir, tmp_path / "train", 200))
    slurm.wait("train-stop", "RUNNING")
    task.send_signal(signal.SIGINT)
    log, _ = task.communicate(timeout=120)
    assert task.returncode == 128 + signal.SIGINT, log
    assert slurm.wait("train-stop", "CANCELLED", timeout_s=60).state == "CANCELLED"
    assert not [j for j in slurm.api.jobs() if j.name == "train-stop" and not j.ended]


def until(task: subprocess.Popen[str], text: str, timeout_s: float = 120) -> str:
    """The task's output up to the first line holding `text`."""
    lines: list[str] = []
    deadline = time.monotonic() + timeout_s
    while not lines or text not in lines[-1]:
        line = task.stdout.readline() if task.stdout else ""
        assert line and time.monotonic() < deadline, "".join(lines)
        lines.append(line)
    return "".join(lines)


def test_a_retried_task_follows_its_own_workflows_job_and_no_other(slurm, workdir, tmp_path):
    """Its pod lost, the task's job goes on: the retry follows it; another workflow's task of the same name does not."""
    argv = train_argv(workdir, tmp_path / "train", 200)
    first = submitter(slurm, "train-adopt", tmp_path, argv)
    job = slurm.wait("train-adopt", "RUNNING")
    first.kill()
    first.wait(30)
    assert (job.user, job.comment) == ("root", job_comment(UID))  # as the real slurmrestd reports them
    other_uid = UID.replace("5f0c", "6a1d")
    other_argv = train_argv(workdir, tmp_path / "other-train", 200)
    other = submitter(slurm, "train-adopt", tmp_path / "other", other_argv, **{"workflow-uid": other_uid})
    log = until(other, "(restarts 0)")  # following its own job: Ctrl-C now cancels it
    assert "submitted Slurm job" in log and f"Slurm job {job.job_id}" not in log, log
    other.send_signal(signal.SIGINT)
    assert other.wait(120) == 128 + signal.SIGINT
    again = submitter(slurm, "train-adopt", tmp_path, argv)
    log = until(again, "(restarts 0)")
    assert f"following Slurm job {job.job_id} (train-adopt), RUNNING: an earlier attempt submitted it" in log, log
    again.send_signal(signal.SIGINT)
    log, _ = again.communicate(timeout=120)
    assert again.returncode == 128 + signal.SIGINT, log
    deadline = time.monotonic() + 60
    while (status := slurm.api.status(job.job_id)) and status.state != "CANCELLED":  # COMPLETING: steps ending
        assert time.monotonic() < deadline, status
        time.sleep(0.5)


def test_a_step_refusing_its_input_fails_the_task_with_2_and_no_retry(slurm, workdir, tmp_path):
    argv = train_argv(workdir, tmp_path / "train", 3, **{"dataset-dir": tmp_path / "no-such-data"})
    task = submitter(slurm, "train-bad", tmp_path, argv)
    log, _ = task.communicate(timeout=600)
    assert task.returncode == 2, log
    assert slurm.job("train-bad").state == "FAILED" and "not retried" in log


def test_a_partition_slurm_does_not_have_is_bad_input_in_one_line_and_never_retried(slurm, workdir, tmp_path):
    """The real slurmctld refuses the job (error 2000); the task ended 1 and Argo retried it to the same refusal."""
    argv = train_argv(workdir, tmp_path / "train", 3)
    task = submitter(slurm, "train-no-partition", tmp_path, argv, partition="no-such-partition")
    log, _ = task.communicate(timeout=120)
    assert task.returncode == 2 and len(log.strip().splitlines()) == 1, log
    assert log.startswith("error: --partition=no-such-partition (cluster.slurm.partition): Slurm refused the job"), log
    assert "Invalid partition name specified" in log and slurm.token_file.read_text() not in log
    assert not [job for job in slurm.api.jobs() if job.name == "train-no-partition"]


def test_an_unreachable_slurmrestd_or_a_rejected_token_is_one_line_naming_the_url(slurm, tmp_path):
    closed = f"http://127.0.0.1:{free_port()}"
    task = submitter(slurm, "never", tmp_path, ["eksflow.llm.steps.train"], url=closed)
    log, _ = task.communicate(timeout=60)
    assert task.returncode == 1 and len(log.strip().splitlines()) == 1 and closed in log, log
    bad = tmp_path / "bad-token"
    bad.write_text("not-a-token-but-secret-looking")
    task = submitter(slurm, "never", tmp_path, ["eksflow.llm.steps.train"], **{"token-file": bad})
    log, _ = task.communicate(timeout=60)
    assert task.returncode == 1 and len(log.strip().splitlines()) == 1 and slurm.url in log, log
    assert "not-a-token-but-secret-looking" not in log


def test_a_pipeline_with_the_slurm_launcher_runs_its_train_task_as_a_slurm_job(slurm, workdir, monkeypatch):
    """`cluster.launcher: slurm` rendered and run by the local executor: the same manifest a cluster gets.

    The job's environment holds the pipeline's `env` and none of the credentials exported where the run started.
    """
    from eksflow import Pipeline, distributed
    from eksflow.llm.steps import train
    from eksflow.local import run_workflow
    from eksflow.render import manifest
    from tests.flagship import config

    cfg = config(
        [
            "cluster.launcher=slurm",
            f"cluster.slurm.url={slurm.url}",
            "cluster.slurm.api_version=v0.0.38",
            "cluster.slurm.user=root",
            "train.max_steps=2",
            "train.max_seq_len=64",
            "train.micro_batch_size=2",
            "train.strategy=ddp",
            "train.precision=fp32",
            "cluster.nodes=2",
            "env.WANDB_PROJECT=eksflow-e2e",
        ]
    )
    exported = {
        "HF_TOKEN": "hf_e2e_secret",
        "AWS_SECRET_ACCESS_KEY": "aws-e2e-secret",
        "MLFLOW_TRACKING_TOKEN": "mlflow-e2e",
    }
    for name, value in exported.items():
        monkeypatch.setenv(name, value)
    with Pipeline(cfg, title="slurm") as p:
        distributed(
            train,
            cfg.train,
            cfg.tracking,
            cfg.model(str(workdir / "model")),
            dataset_dir=str(workdir / "data"),
            output_dir=p.run_dir / "train",
            run_name=p.workflow_name,
        )
    state = Path(slurm.env["EKSFLOW_STATE_DIR"])
    result = run_workflow(manifest(p), state, cwd=ROOT)
    assert result.phase == "Succeeded", result.message
    (run_dir,) = (state / "runs").iterdir()
    node = json.loads((run_dir / "status.json").read_text())["status"]["nodes"]["train"]
    outputs = {o["name"]: o["value"] for o in node["outputs"]["parameters"]}
    adapter = state / "volumes" / "fsx-claim" / Path(outputs["adapter_dir"]).relative_to("/fsx")  # /fsx here
    assert (adapter / "adapter_config.json").is_file()
    job = slurm.job(f"{run_dir.name}-train")  # one job per run and task, named after both
    assert job.state == "COMPLETED"
    uid = json.loads((run_dir / "status.json").read_text())["metadata"]["uid"]
    assert (job.user, job.comment) == ("root", job_comment(uid))
    environment = slurm.environment(job.job_id)
    assert environment["WANDB_PROJECT"] == "eksflow-e2e" and environment["HF_HUB_OFFLINE"] == "1"
    assert environment["GLOO_SOCKET_IFNAME"] == "eth0"  # the profile's, for a job of several nodes
    assert not set(exported) & set(environment), sorted(environment)
    assert not [v for v in environment.values() if any(secret in v for secret in exported.values())]
    log = (run_dir / "logs" / "train.log").read_text()
    assert f"submitted Slurm job {job.job_id}" in log and "strategy: ddp" in log
    assert {host.split()[0] for host in re.findall(r"rank \d/2: host (\S+ \S+)", log)} == {
        "slurm-node-1",
        "slurm-node-2",
    }
