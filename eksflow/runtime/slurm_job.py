r"""Run a step as a Slurm batch job through slurmrestd, follow it to its end, and end the way the step did.

    python -m eksflow.runtime.slurm_job --url=http://slurmrestd:6820 --token-file=/etc/eksflow/slurm/token \
        --job-name=llama-lora-x7k2-train --workflow-uid=<uid> --work-dir=/fsx/runs/llama-lora-x7k2/slurm/train \
        --nodes=2 --tasks-per-node=8 --gpus-per-node=8 --forward-env='["NCCL_PROTO","WANDB_PROJECT"]' \
        --outputs-dir=/tmp/outputs -- eksflow.llm.steps.train --dataset-dir=... ...

The task of `cluster.launcher: slurm` (eksflow/launchers/slurm.py). The job's script is a constant (SCRIPT): it
runs the step on every task of the allocation with `srun`, and the step's argv travels in the job's environment
as JSON (EKSFLOW_STEP_ARGV, run by eksflow.runtime.slurm_task), never in the script's text. Each task is one rank
(the train step's `--launcher=mpi` reads srun's SLURM_PROCID and SLURM_NTASKS; MASTER_ADDR is the allocation's
first node, MASTER_PORT 20000 + the job id modulo 10000, so two jobs Slurm packs on one node never meet on one port,
as two on 29500 did).

What reaches the ranks' environment (and slurmctld's job record, which keeps it): PATH, PYTHONPATH and HOME, the
job's own EKSFLOW_* variables above, and the variables --forward-env names, with this task's values. The Slurm
launcher names exactly the variables it gives this task's container: the profile's (HF_HUB_OFFLINE, EFA/NCCL) and
the pipeline's `env`. Nothing else of this task's environment goes (no prefix matches: HF_ would take HF_TOKEN), and
--forward-env refuses the credentials eksflow knows (shown.SECRET_ENV): a rank gets a secret only from a Secret
mounted on Slurm's nodes, never through the job's record.

The step writes its outputs to <work-dir>/outputs on the shared file system; once the job COMPLETED they are
copied to --outputs-dir, where Argo reads them. Its progress goes to <work-dir>/progress, copied to this task's
$ARGO_PROGRESS_FILE as it changes (the N/M of Argo's UI and of `run`'s table).

While the job runs its output file is copied into this task's log. A job Slurm requeues (`scontrol requeue`, a
failed node with JobRequeue) goes on under the same id and the step resumes from its checkpoint; this task keeps
following it, says so in one line, and tells it in its `slurm_requeues` output (what `get`, the Argo UI and the report
show of a task that succeeded). How the job's end becomes this task's exit code (the workflow retries all but 2):
    COMPLETED                            0, the outputs copied
    FAILED with the step's exit 2        2: bad input, never retried (on any task: its other tasks, terminated
                                         by srun, end the job with 143, so the task that refused says so)
    FAILED otherwise, CANCELLED by others 1: retried
    PREEMPTED, NODE_FAIL, BOOT_FAIL      143: retried, the step resumes from its checkpoint
    TIMEOUT                              1 the first time, 2 the second (raise the time limit)
SIGTERM or Ctrl-C (the workflow stopped, the run interrupted) cancels the job first. An earlier attempt's job that
has not ended is followed instead of submitting a second one: a job is taken for this task's only when its name,
its user (--user, the token's) and its comment (made of --workflow-uid at submission) all match, so another
user's job, or another workflow's of the same name, is never adopted.

The JWT is read from --token-file (a mounted Secret), never from an argument, and never printed: an empty token
or one with a line break inside is refused before any request. Bad arguments end in one line each, naming the
flag, with exit 2.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Literal

from pydantic import Field, ValidationError, field_validator

from eksflow.errors import EXIT_BAD_INPUT, EXIT_FAILED, EksflowError
from eksflow.runtime.args import StepArgs, StepInputError, error_lines, print_error
from eksflow.runtime.outputs import atomic_write_text
from eksflow.runtime.shown import SECRET_ENV, shown
from eksflow.runtime.slurm import (
    JobSpec,
    JobStatus,
    SlurmApi,
    SlurmError,
    SlurmJobRefusedError,
    SlurmTokenError,
    SlurmUrl,
    TimeLimitMin,
    slurm_api,
)
from eksflow.runtime.slurm_task import ARGV_ENV, REFUSED_ENV

PYTHON_ENV = "EKSFLOW_PYTHON"
PROGRESS_ENV = "ARGO_PROGRESS_FILE"  # where a step writes its N/M (eksflow.runtime.outputs.Progress)
EXIT_PREEMPTED = 143
REQUEUES_OUTPUT = "slurm_requeues"  # this task's own output: the requeues of its job ("none": the launcher's default)
# How to fix a setting Slurm refused (slurm.REFUSED_SETTINGS), by JobArgs field.
REFUSAL_FIXES = {
    "partition": "a partition `sinfo` lists, or empty for the cluster's default",
    "account": "an account of the user's associations (`sacctmgr show assoc`), or empty for the user's default",
    "qos": "a QoS the user may use (`sacctmgr show assoc`), or empty for the default",
    "time_limit_min": "at most the partition's MaxTime (`scontrol show partition`), or 0 for the partition's own",
}
SCRIPT = """#!/bin/bash
# eksflow: the step on every task of the allocation; its argv is $EKSFLOW_STEP_ARGV (JSON), never this text.
set -euo pipefail
# sed reads the whole list: `head -n 1` may exit before scontrol has written it, and pipefail then ends the job
# with scontrol's SIGPIPE (141).
first="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)"
# The first node's address as slurmctld knows it (a pod IP on Slinky): its name may not resolve everywhere.
MASTER_ADDR="$(scontrol show node "$first" -o | tr ' ' '\\n' | sed -n 's/^NodeAddr=//p')"
# Per job, below Linux's ephemeral ports: jobs sharing a node must not share rank 0's TCPStore port.
export MASTER_ADDR="${MASTER_ADDR:-$first}" MASTER_PORT="${MASTER_PORT:-$((20000 + SLURM_JOB_ID % 10000))}"
exec srun --kill-on-bad-exit=1 "$EKSFLOW_PYTHON" -m eksflow.runtime.slurm_task
"""
RETRIED = frozenset({"PREEMPTED", "NODE_FAIL", "BOOT_FAIL"})
# What every job gets of this task's environment besides --forward-env: where Python and the user's files are.
FORWARDED = ("PYTHONPATH", "HOME")
ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"
UUID = r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"  # a Kubernetes object's uid


class JobArgs(StepArgs):
    """Where slurmrestd is, what the job asks for, where its files go."""

    url: SlurmUrl = Field(description="slurmrestd, e.g. http://slurm-restapi.slurm:6820")
    api_version: Literal["v0.0.38", "v0.0.44"] = Field("v0.0.38", description="slurmrestd's OpenAPI version")
    user: str = Field("root", min_length=1, description="the Slurm user the token was made for")
    token_file: Path = Field(description="the JWT (`scontrol token`), a file from a mounted Secret")
    job_name: str = Field(pattern=r"^[A-Za-z0-9][-A-Za-z0-9_.]*$", max_length=200, description="unique per run")
    workflow_uid: str = Field(pattern=UUID, description="the workflow's uid: the job's comment, what adoption checks")
    work_dir: Path = Field(description="the job's folder on the shared file system (output file, step outputs)")
    partition: str = Field("", pattern=r"^[-A-Za-z0-9_.]*$", description="empty: the cluster's default")
    account: str = Field("", pattern=r"^[-A-Za-z0-9_.]*$", description="empty: the user's default")
    qos: str = Field("", pattern=r"^[-A-Za-z0-9_.]*$", description="empty: the default QoS")
    time_limit_min: TimeLimitMin = Field(0, description="the job's time limit in minutes; 0: the partition's")
    nodes: int = Field(1, ge=1)
    tasks_per_node: int = Field(1, ge=1, description="ranks per node (one per GPU)")
    cpus_per_task: int = Field(1, ge=1)
    gpus_per_node: int = Field(0, ge=0)
    forward_env: list[str] = Field(
        [], description='names of this task\'s environment variables the job gets (their values), e.g. ["HF_HOME"]'
    )
    poll_s: float = Field(2.0, gt=0, description="seconds between two looks at the job")

    @field_validator("forward_env")
    @classmethod
    def _no_credentials(cls, names: list[str]) -> list[str]:
        for name in names:
            if not re.fullmatch(ENV_NAME, name):
                raise ValueError(f"{name[:60]!r} is not an environment variable name (letters, digits, _)")
            if name in SECRET_ENV:
                raise ValueError(
                    f"{name} is a credential, and the job's environment is kept in slurmctld's job record; "
                    "give it to the ranks from a Secret mounted on Slurm's nodes"
                )
        return names


class _StopSignalError(Exception):
    """SIGTERM or SIGINT arrived."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def run(args: JobArgs, step_argv: Sequence[str]) -> int:
    """Submit (or adopt) the job, follow it, copy its outputs; the exit code the task ends with."""
    if not step_argv or not step_argv[0].replace(".", "").replace("_", "").isalnum():
        raise StepInputError(
            "give the step module and its arguments after `--`: -- eksflow.llm.steps.train --dataset-dir=..."
        )
    api = client(args)
    outputs = args.work_dir / "outputs"
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}

    def stop(signum: int, frame: FrameType | None) -> None:
        raise _StopSignalError(signum)

    # From before the job exists: a stop during the submission still finds the job (by its comment) and cancels it.
    for signum in handlers:
        signal.signal(signum, stop)
    job_id: int | None = None
    try:
        job = adopted(api, args)
        if job is None:
            shutil.rmtree(outputs, ignore_errors=True)  # a new job: no earlier one's outputs may pass for its own
            outputs.mkdir(parents=True, exist_ok=True)
            refused_file(args).unlink(missing_ok=True)
            progress_file(args).unlink(missing_ok=True)
            try:
                job_id = api.submit(spec(args, step_argv, outputs))
            except SlurmJobRefusedError as err:
                flag = err.setting.replace("_", "-")
                raise StepInputError(
                    f"--{flag}={getattr(args, err.setting)} (cluster.slurm.{err.setting}): Slurm refused the job: "
                    f"{err}; fix: {REFUSAL_FIXES[err.setting]}"
                ) from None
            _tell(f"submitted Slurm job {job_id} ({args.job_name}) to {args.url}")
        else:
            job_id = job.job_id
            _tell(f"following Slurm job {job_id} ({args.job_name}), {job.state}: an earlier attempt submitted it")
        followed = follow(api, job_id, args.work_dir / "slurm.out", args.poll_s, progress_file(args))
    except _StopSignalError as stopped:
        for signum in handlers:  # a second signal while cancelling ends the task as the signal would
            signal.signal(signum, signal.SIG_DFL)
        if job_id is None and (job := adopted(api, args)) is not None:
            job_id = job.job_id
        if job_id is not None:
            api.cancel(job_id)
            _tell(f"{stopped}: cancelled Slurm job {job_id}")
        return 128 + stopped.signum
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
    return finish(args, followed.status, outputs, followed.requeues)


def client(args: JobArgs) -> SlurmApi:
    """The slurmrestd client with the token of --token-file; StepInputError, without the token, if it cannot be."""
    try:
        token = args.token_file.read_text(encoding="utf-8").strip()
    except OSError as err:
        raise StepInputError(f"--token-file={args.token_file}: {err.strerror}; mount the Slurm token Secret") from err
    except UnicodeDecodeError:
        raise StepInputError(f"--token-file={args.token_file}: not UTF-8 text; it must hold the JWT alone") from None
    try:
        return slurm_api(args.api_version, args.url, user=args.user, token=token)
    except SlurmTokenError as err:
        raise StepInputError(
            f"--token-file={args.token_file}: {err}; the Secret's key `token` holds what `scontrol token` prints "
            "after SLURM_JWT="
        ) from None


def job_comment(workflow_uid: str) -> str:
    """The comment of the jobs a workflow submits: what tells its own jobs from others of the same name."""
    return f"eksflow workflow {workflow_uid}"


def adopted(api: SlurmApi, args: JobArgs) -> JobStatus | None:
    """This task's job from an earlier attempt, not ended: the same name, user and workflow (its comment)."""
    comment = job_comment(args.workflow_uid)
    return next(
        (
            job
            for job in api.jobs()
            if job.name == args.job_name and job.user == args.user and job.comment == comment and not job.ended
        ),
        None,
    )


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
        PROGRESS_ENV: str(progress_file(args)),  # on the shared file system: this task copies it to its own
    }
    for name in (*FORWARDED, *args.forward_env):
        if name in os.environ:
            environment[name] = os.environ[name]
    return JobSpec(
        name=args.job_name,
        script=SCRIPT,
        environment=environment,
        working_directory=str(args.work_dir),
        standard_output=str(args.work_dir / "slurm.out"),
        comment=job_comment(args.workflow_uid),
        partition=args.partition,
        account=args.account,
        qos=args.qos,
        time_limit_min=args.time_limit_min,
        nodes=args.nodes,
        tasks_per_node=args.tasks_per_node,
        cpus_per_task=args.cpus_per_task,
        gpus_per_node=args.gpus_per_node,
    )


@dataclass(frozen=True)
class Followed:
    """How a followed job ended, and the requeues Slurm made of it (one line each)."""

    status: JobStatus
    requeues: tuple[str, ...] = ()


def follow(api: SlurmApi, job_id: int, output: Path, poll_s: float, progress: Path) -> Followed:
    """Poll the job until it ends, copying its output file to stderr and its progress file to this task's.

    A requeue (Slurm's restart count going up) is told in one line, with the state or reason that caused it.
    """
    offset, last, shown_progress = 0, "", ""
    requeues: list[str] = []
    previous: JobStatus | None = None
    while True:
        status = api.status(job_id)
        offset = _copy_new(output, offset)
        shown_progress = _copy_progress(progress, shown_progress)
        if status is None:
            raise SlurmError(f"Slurm job {job_id} vanished from slurmctld before this task saw it end")
        reason = f", {status.reason}" if status.reason not in ("", "None") else ""
        described = f"{status.state} (restarts {status.restarts}{reason})"
        if described != last:
            _tell(f"Slurm job {job_id}: {described}")
            last = described
        if previous is not None and status.restarts > previous.restarts:
            requeues.append(requeue_cause(previous, status))
            _tell(f"Slurm job {job_id} requeued ({requeues[-1]}): the step resumes from its checkpoint")
        previous = status
        if status.ended:
            time.sleep(min(poll_s, 1.0))  # the output file's last lines land after the state changes
            _copy_new(output, offset)
            _copy_progress(progress, shown_progress)
            return Followed(status, tuple(requeues))
        time.sleep(poll_s)


def requeue_cause(before: JobStatus, after: JobStatus) -> str:
    """One requeue as the looks around it saw it: `restart 1: ran on slurm-node-[1-2]; reason BeginTime`.

    Slurm's job record keeps no cause of a requeue (a node's failure leaves it PENDING with the count raised): what
    it was, where it ran and the reasons given are what there is to say.
    """
    parts = [f"was {before.state}"] if before.state not in ("RUNNING", "PENDING", "CONFIGURING") else []
    if before.nodes:
        parts.append(f"ran on {before.nodes}")
    reasons = dict.fromkeys(r for r in (before.reason, after.reason) if r and r != "None")
    if reasons:
        parts.append(f"reason {', '.join(reasons)}")
    return f"restart {after.restarts}: {'; '.join(parts) or 'no reason given'}"


def requeues_line(job: JobStatus, seen: Sequence[str]) -> str:
    """The `slurm_requeues` output: how often Slurm requeued the job, and why where this task saw it."""
    told = "; ".join(seen) if seen else "requeued before this task followed it"
    return f"{job.restarts} (Slurm job {job.job_id}: {told}; the step resumed from its checkpoint)"


def progress_file(args: JobArgs) -> Path:
    """Where rank 0 of the job writes its progress (N/M), on the shared file system."""
    return args.work_dir / "progress"


def _copy_progress(source: Path, shown_progress: str) -> str:
    """Copy the job's progress to this task's $ARGO_PROGRESS_FILE when it changed; what it now shows."""
    target = os.environ.get(PROGRESS_ENV)
    try:
        current = source.read_text(encoding="utf-8").strip()
    except OSError:
        return shown_progress
    if target and current and current != shown_progress:
        with contextlib.suppress(OSError):  # a display only: the job's outputs are what matters
            atomic_write_text(Path(target), current)
    return current


def refused_file(args: JobArgs) -> Path:
    """The file a task of the job writes when the step refused its input (eksflow.runtime.slurm_task)."""
    return args.work_dir / "refused-input"


def finish(args: JobArgs, job: JobStatus, outputs: Path, requeues: Sequence[str] = ()) -> int:
    """The task's exit code for how the job ended (see the module docstring); the outputs on success.

    `requeues`: the requeues this task saw (follow); with the job's restart count they make the `slurm_requeues` output.
    """
    where = f"Slurm job {job.job_id} ended {job.state} (exit {job.exit_code}, reason {job.reason or 'none'})"
    if job.state == "COMPLETED":
        args.outputs_dir.mkdir(parents=True, exist_ok=True)
        for item in sorted(outputs.iterdir()) if outputs.is_dir() else []:
            if item.is_file():
                atomic_write_text(args.outputs_dir / item.name, item.read_text(encoding="utf-8"))
        if job.restarts:
            atomic_write_text(args.outputs_dir / REQUEUES_OUTPUT, requeues_line(job, requeues))
        return 0
    if job.state == "FAILED" and (job.exit_code == EXIT_BAD_INPUT or refused_file(args).exists()):
        _tell(f"{where}: the step refused its input; not retried")
        return EXIT_BAD_INPUT
    if job.state in RETRIED:
        _tell(f"{where}: retried; the step resumes from its checkpoint")
        return EXIT_PREEMPTED
    if job.state == "TIMEOUT":
        marker = args.work_dir / "timed-out"
        if marker.exists():
            _tell(f"{where} a second time: raise cluster.slurm.time_limit_min")
            return EXIT_BAD_INPUT
        marker.touch()
        _tell(f"{where}: retried once, from the checkpoint")
        return EXIT_FAILED
    _tell(where)
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


def _tell(line: str) -> None:
    """A line of this task's own on stderr, through `shown`: slurmrestd's text (a state reason) among it."""
    print(shown(line), file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: `python -m eksflow.runtime.slurm_job --name=value ... -- <step module> <step argv>`."""
    items = list(sys.argv[1:] if argv is None else argv)
    own, step_argv = (items[: items.index("--")], items[items.index("--") + 1 :]) if "--" in items else (items, [])
    if any(item in ("-h", "--help") for item in own):
        print(__doc__)
        return 0
    try:
        return run(JobArgs.from_argv(own), step_argv)
    except ValidationError as err:  # one line per bad argument, naming its flag, as every step's
        for line in error_lines(err):
            print_error(line)
        return EXIT_BAD_INPUT
    except EksflowError as err:
        _tell(f"{err.label}: {err}")
        return err.exit_code


if __name__ == "__main__":
    raise SystemExit(main())
