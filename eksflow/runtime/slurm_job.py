r"""Run a step as a Slurm batch job through slurmrestd, follow it to its end, and end the way the step did.

    python -m eksflow.runtime.slurm_job --url=http://slurmrestd:6820 --token-file=/etc/eksflow/slurm/token \
        --job-name=llama-lora-x7k2-train --work-dir=/fsx/runs/llama-lora-x7k2/slurm/train --nodes=2 \
        --tasks-per-node=8 --gpus-per-node=8 --outputs-dir=/tmp/outputs -- steps.train --dataset-dir=... ...

The task of `cluster.launcher: slurm` (eksflow/launchers/slurm.py). The job's script is a constant (SCRIPT): it
runs the step on every task of the allocation with `srun`, and the step's argv travels in the job's environment
as JSON (EKSFLOW_STEP_ARGV, run by eksflow.runtime.slurm_task), never in the script's text. Each task is one rank
(the train step's `--launcher=mpi` reads srun's SLURM_PROCID and SLURM_NTASKS; MASTER_ADDR is the allocation's
first node).
The step writes its outputs to <work-dir>/outputs on the shared file system; once the job COMPLETED they are
copied to --outputs-dir, where Argo reads them.

While the job runs its output file is copied into this task's log. A job Slurm requeues (`scontrol requeue`, a
failed node with JobRequeue) goes on under the same id and the step resumes from its checkpoint; this task keeps
following it. How the job's end becomes this task's exit code (the workflow retries all but 2):
    COMPLETED                            0, the outputs copied
    FAILED with the step's exit 2        2: bad input, never retried (on any task: its other tasks, terminated
                                         by srun, end the job with 143, so the task that refused says so)
    FAILED otherwise, CANCELLED by others 1: retried
    PREEMPTED, NODE_FAIL, BOOT_FAIL      143: retried, the step resumes from its checkpoint
    TIMEOUT                              1 the first time, 2 the second (raise the time limit)
SIGTERM or Ctrl-C (the workflow stopped, the run interrupted) cancels the job first. A job of the same name that
has not ended (an earlier attempt of this task) is followed instead of submitting a second one.

The JWT is read from --token-file (a mounted Secret), never from an argument, and never printed.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Literal

from pydantic import Field

from eksflow.errors import EXIT_BAD_INPUT, EXIT_FAILED, EksflowError
from eksflow.runtime.args import StepArgs, StepInputError
from eksflow.runtime.outputs import atomic_write_text
from eksflow.runtime.slurm import JobSpec, JobStatus, SlurmApi, SlurmError, slurm_api
from eksflow.runtime.slurm_task import ARGV_ENV, REFUSED_ENV

PYTHON_ENV = "EKSFLOW_PYTHON"
EXIT_PREEMPTED = 143
SCRIPT = """#!/bin/bash
# eksflow: the step on every task of the allocation; its argv is $EKSFLOW_STEP_ARGV (JSON), never this text.
set -euo pipefail
first="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"
# The first node's address as slurmctld knows it (a pod IP on Slinky): its name may not resolve everywhere.
MASTER_ADDR="$(scontrol show node "$first" -o | tr ' ' '\\n' | sed -n 's/^NodeAddr=//p')"
export MASTER_ADDR="${MASTER_ADDR:-$first}" MASTER_PORT="${MASTER_PORT:-29500}"
exec srun --kill-on-bad-exit=1 "$EKSFLOW_PYTHON" -m eksflow.runtime.slurm_task
"""
RETRIED = frozenset({"PREEMPTED", "NODE_FAIL", "BOOT_FAIL"})
# What the job's tasks get of this task's environment (the pipeline's `env` and the profile's EFA/NCCL settings
# reach this container as these): never credentials (the NodeSet's pods have their own service account).
FORWARDED = frozenset({"PYTHONPATH", "HOME", "RDMAV_FORK_SAFE"})
FORWARDED_PREFIXES = ("EKSFLOW_", "HF_", "NCCL_", "FI_", "TORCH_", "OMP_", "CUDA_")


class JobArgs(StepArgs):
    """Where slurmrestd is, what the job asks for, where its files go."""

    url: str = Field(pattern=r"^https?://", description="slurmrestd, e.g. http://slurm-restapi.slurm:6820")
    api_version: Literal["v0.0.38", "v0.0.44"] = Field("v0.0.38", description="slurmrestd's OpenAPI version")
    user: str = Field("root", min_length=1, description="the Slurm user the token was made for")
    token_file: Path = Field(description="the JWT (`scontrol token`), a file from a mounted Secret")
    job_name: str = Field(pattern=r"^[A-Za-z0-9][-A-Za-z0-9_.]*$", max_length=200, description="unique per run")
    work_dir: Path = Field(description="the job's folder on the shared file system (output file, step outputs)")
    partition: str = Field("", pattern=r"^[-A-Za-z0-9_.]*$", description="empty: the cluster's default")
    account: str = Field("", pattern=r"^[-A-Za-z0-9_.]*$", description="empty: the user's default")
    qos: str = Field("", pattern=r"^[-A-Za-z0-9_.]*$", description="empty: the default QoS")
    time_limit_min: int = Field(0, ge=0, description="the job's time limit in minutes; 0: the partition's")
    nodes: int = Field(1, ge=1)
    tasks_per_node: int = Field(1, ge=1, description="ranks per node (one per GPU)")
    cpus_per_task: int = Field(1, ge=1)
    gpus_per_node: int = Field(0, ge=0)
    poll_s: float = Field(2.0, gt=0, description="seconds between two looks at the job")


class _StopSignalError(Exception):
    """SIGTERM or SIGINT arrived."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def run(args: JobArgs, step_argv: Sequence[str]) -> int:
    """Submit (or adopt) the job, follow it, copy its outputs; the exit code the task ends with."""
    if not step_argv or not step_argv[0].replace(".", "").replace("_", "").isalnum():
        raise StepInputError("give the step module and its arguments after `--`: -- steps.train --dataset-dir=...")
    try:
        token = args.token_file.read_text(encoding="utf-8").strip()
    except OSError as err:
        raise StepInputError(f"--token-file={args.token_file}: {err.strerror}; mount the Slurm token Secret") from err
    api = slurm_api(args.api_version, args.url, user=args.user, token=token)
    outputs = args.work_dir / "outputs"
    job = adopted(api, args.job_name)
    if job is None:
        shutil.rmtree(outputs, ignore_errors=True)  # a new job: no outputs of an earlier one may be taken for its own
        outputs.mkdir(parents=True, exist_ok=True)
        refused_file(args).unlink(missing_ok=True)
        job_id = api.submit(spec(args, step_argv, outputs))
        print(f"submitted Slurm job {job_id} ({args.job_name}) to {args.url}", file=sys.stderr, flush=True)
    else:
        job_id = job.job_id
        print(f"following Slurm job {job_id} ({args.job_name}), {job.state}: an earlier attempt submitted it",
              file=sys.stderr, flush=True)  # fmt: skip
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}

    def stop(signum: int, frame: FrameType | None) -> None:
        raise _StopSignalError(signum)

    for signum in handlers:
        signal.signal(signum, stop)
    try:
        ended = follow(api, job_id, args.work_dir / "slurm.out", args.poll_s)
    except _StopSignalError as stopped:
        api.cancel(job_id)
        print(f"{stopped}: cancelled Slurm job {job_id}", file=sys.stderr, flush=True)
        return 128 + stopped.signum
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
    return finish(args, ended, outputs)


def adopted(api: SlurmApi, name: str) -> JobStatus | None:
    """The job of this name that has not ended (an earlier attempt's), if any."""
    return next((job for job in api.jobs() if job.name == name and not job.ended), None)


def spec(args: JobArgs, step_argv: Sequence[str], outputs: Path) -> JobSpec:
    """The job: the constant script, the step's argv as JSON in the environment, the resources."""
    module, *rest = step_argv
    # The step's outputs go to the shared file system, where this task (on another node) reads them.
    own = [item for item in rest if not item.startswith("--outputs-dir=")]
    argv = [sys.executable, "-m", module, *own, f"--outputs-dir={outputs}"]
    environment = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        ARGV_ENV: json.dumps(argv),
        REFUSED_ENV: str(refused_file(args)),
        PYTHON_ENV: sys.executable,  # the step image's interpreter: Slurm's nodes run the same image
    }
    for name, value in os.environ.items():
        if name in FORWARDED or name.startswith(FORWARDED_PREFIXES):
            environment[name] = value
    return JobSpec(
        name=args.job_name,
        script=SCRIPT,
        environment=environment,
        working_directory=str(args.work_dir),
        standard_output=str(args.work_dir / "slurm.out"),
        partition=args.partition,
        account=args.account,
        qos=args.qos,
        time_limit_min=args.time_limit_min,
        nodes=args.nodes,
        tasks_per_node=args.tasks_per_node,
        cpus_per_task=args.cpus_per_task,
        gpus_per_node=args.gpus_per_node,
    )


def follow(api: SlurmApi, job_id: int, output: Path, poll_s: float) -> JobStatus:
    """Poll the job until it ends, copying its output file to stderr as it grows; its last status."""
    offset, last = 0, ""
    while True:
        status = api.status(job_id)
        offset = _copy_new(output, offset)
        if status is None:
            raise SlurmError(f"Slurm job {job_id} vanished from slurmctld before this task saw it end")
        described = f"{status.state} (restarts {status.restarts})"
        if described != last:
            print(f"Slurm job {job_id}: {described}", file=sys.stderr, flush=True)
            last = described
        if status.ended:
            time.sleep(min(poll_s, 1.0))  # the output file's last lines land after the state changes
            _copy_new(output, offset)
            return status
        time.sleep(poll_s)


def refused_file(args: JobArgs) -> Path:
    """The file a task of the job writes when the step refused its input (eksflow.runtime.slurm_task)."""
    return args.work_dir / "refused-input"


def finish(args: JobArgs, job: JobStatus, outputs: Path) -> int:
    """The task's exit code for how the job ended (see the module docstring); the outputs on success."""
    where = f"Slurm job {job.job_id} ended {job.state} (exit {job.exit_code}, reason {job.reason or 'none'})"
    if job.state == "COMPLETED":
        args.outputs_dir.mkdir(parents=True, exist_ok=True)
        for item in sorted(outputs.iterdir()) if outputs.is_dir() else []:
            if item.is_file():
                atomic_write_text(args.outputs_dir / item.name, item.read_text(encoding="utf-8"))
        return 0
    if job.state == "FAILED" and (job.exit_code == EXIT_BAD_INPUT or refused_file(args).exists()):
        print(f"{where}: the step refused its input; not retried", file=sys.stderr)
        return EXIT_BAD_INPUT
    if job.state in RETRIED:
        print(f"{where}: retried; the step resumes from its checkpoint", file=sys.stderr)
        return EXIT_PREEMPTED
    if job.state == "TIMEOUT":
        marker = args.work_dir / "timed-out"
        if marker.exists():
            print(f"{where} a second time: raise cluster.slurm.time_limit_min", file=sys.stderr)
            return EXIT_BAD_INPUT
        marker.touch()
        print(f"{where}: retried once, from the checkpoint", file=sys.stderr)
        return EXIT_FAILED
    print(where, file=sys.stderr)
    return EXIT_FAILED


def _copy_new(path: Path, offset: int) -> int:
    """Copy what `path` gained since `offset` to stderr; the new offset.

    A requeued job writes its output file anew (Slurm truncates it): a file shorter than the offset is read from
    its start again.
    """
    try:
        with open(path, "rb") as f:
            if os.fstat(f.fileno()).st_size < offset:
                offset = 0
            f.seek(offset)
            chunk = f.read()
    except OSError:
        return offset
    if chunk:
        sys.stderr.write(chunk.decode("utf-8", "replace"))
        sys.stderr.flush()
    return offset + len(chunk)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: `python -m eksflow.runtime.slurm_job --name=value ... -- <step module> <step argv>`."""
    items = list(sys.argv[1:] if argv is None else argv)
    own, step_argv = (items[: items.index("--")], items[items.index("--") + 1 :]) if "--" in items else (items, [])
    if any(item in ("-h", "--help") for item in own):
        print(__doc__)
        return 0
    try:
        return run(JobArgs.from_argv(own), step_argv)
    except EksflowError as err:
        print(f"{err.label}: {err}", file=sys.stderr)
        return err.exit_code
    except ValueError as err:  # the arguments' validation
        print(f"bad input: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    raise SystemExit(main())
