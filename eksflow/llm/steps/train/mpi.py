"""`--launcher=mpi`: the train step as one rank of `mpirun -np N` (an MPIJob's launcher) or of `srun` (a Slurm job).

`--launcher=torchrun` runs the same way as a worker of torchrun (a TrainJob's): eksflow.llm.steps.train.torchrun
says what differs (where the ranks and the store come from).

    mpirun -np 2 -x MASTER_ADDR -x MASTER_PORT python -m eksflow.llm.steps.train --launcher=mpi --strategy=deepspeed ...

Ranks come from the MPI environment (Open MPI's OMPI_COMM_WORLD_*, or PMI_RANK/PMI_SIZE from MPICH and Intel MPI)
or from srun's (SLURM_PROCID, SLURM_STEP_NUM_TASKS, SLURM_LOCALID, SLURM_STEP_TASKS_PER_NODE);
the ranks meet in a TCPStore at MASTER_ADDR:MASTER_PORT (127.0.0.1 when every rank is on this host; 29500 by
default, torch's convention), on which the process group is built (gloo; gloo + NCCL when CUDA is present).

Rank 0 is the driver, as Ray Train's driver is: it checks the input, resolves the base model, takes the lease and
the MLflow run, then publishes the LoopConfig in the store; every rank then runs the same loop
(eksflow.llm.steps.train.loop) and rank 0 alone writes checkpoints and the step's outputs. A rank 0 that stops before
training publishes its exit code instead, and the other ranks exit with it, so mpirun reports the driver's code (2 for
bad input).

SIGTERM: each rank's handler asks for a checkpoint at the next step boundary (the ranks agree through an
all-reduce), as under the local launcher. Open MPI's mpirun forwards a SIGTERM to the ranks but kills them about a
second later, so in an MPIJob a Spot notice costs up to `checkpoint_every` steps rather than none.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from types import FrameType
from typing import Any, NoReturn

from pydantic import ValidationError

from eksflow.errors import EXIT_BAD_INPUT, EXIT_FAILED
from eksflow.llm.steps.train import Args, torchrun
from eksflow.llm.steps.train.loop import LoopConfig, WorkerContext, sigterm_received, train_worker
from eksflow.runtime.args import StepInputError

DEFAULT_PORT = 29500
START_KEY = "eksflow/train/start"  # rank 0 publishes {"loop": ...} or {"exit": code} here
# Followers wait this long for rank 0's model download and lease (an S3 copy of a large model takes a while).
START_TIMEOUT = timedelta(hours=2)


@dataclass(frozen=True)
class Ranks:
    """This process's place in the MPI job."""

    rank: int
    size: int
    local_rank: int
    local_size: int
    launcher: str = "mpi"  # the --launcher that runs under what started this process: mpi, or torchrun

    @property
    def starter(self) -> str:
        """What started the ranks, as its users call it: mpirun (or srun), or torchrun."""
        return "torchrun" if self.launcher == "torchrun" else "mpirun"


def ranks_from_env(env: Mapping[str, str] = os.environ) -> Ranks | None:
    """The job's ranks from the environment torchrun, mpirun or srun gives each process, or None outside them.

    srun's SLURM_STEP_ID marks a task of a job step (eksflow.runtime.slurm_job runs the step with srun); the batch
    script itself has SLURM_PROCID 0 too, but no step of its own to share.
    """
    started = torchrun.ranks_from_env(env)
    if started is not None:
        return Ranks(*started, launcher="torchrun")
    for rank_key, size_key, local_key, local_size_key in (
        ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),
        ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
        ("SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID", "SLURM_STEP_TASKS_PER_NODE"),
    ):
        if rank_key in env and size_key in env:
            rank, size = int(env[rank_key]), int(env[size_key])
            # srun writes tasks per node as "2(x3)" (2 on each of 3 nodes); the first count is this layout's.
            local_size = env.get(local_size_key, str(size)).split("(")[0].split(",")[0]
            return Ranks(rank, size, int(env.get(local_key, rank)), int(local_size))
    return None


def rendezvous(ranks: Ranks, env: Mapping[str, str] = os.environ) -> tuple[str, int]:
    """MASTER_ADDR and MASTER_PORT: where rank 0 listens; an address is required when ranks span hosts."""
    address = env.get("MASTER_ADDR", "")
    if not address:
        if ranks.local_size != ranks.size:
            raise StepInputError(
                f"MASTER_ADDR is not set and the {ranks.size} ranks span hosts: set it to rank 0's host "
                "(an MPIJob's first worker pod) and pass it with `mpirun -x MASTER_ADDR`"
            )
        address = "127.0.0.1"
    port = env.get("MASTER_PORT", str(DEFAULT_PORT))
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise StepInputError(f"MASTER_PORT={port!r} is not a TCP port; set a free port, e.g. 29500")
    return address, int(port)


@dataclass
class Session:
    """The store and process group of one MPI job, and whether rank 0 has published its start message."""

    ranks: Ranks
    store: Any  # torch.distributed.TCPStore
    published: bool = False

    def publish(self, message: dict[str, Any]) -> None:
        """Rank 0: tell the other ranks to train (`loop`) or to exit (`exit`)."""
        self.store.set(START_KEY, json.dumps(message))
        self.published = True

    def wait(self) -> dict[str, Any]:
        """Ranks 1..: rank 0's start message."""
        self.store.wait([START_KEY], START_TIMEOUT)
        message: dict[str, Any] = json.loads(self.store.get(START_KEY))
        return message

    def context(self, loop: LoopConfig) -> WorkerContext:
        """This rank's WorkerContext: DDP from torch (no Ray), stop requests from this process's SIGTERM."""
        import torch

        use_gpu = loop.settings.use_gpu and torch.cuda.is_available()
        device = torch.device("cuda", self.ranks.local_rank) if use_gpu else torch.device("cpu")
        if use_gpu:
            torch.cuda.set_device(device)

        def prepare(model: Any) -> Any:
            from torch.nn.parallel import DistributedDataParallel

            return DistributedDataParallel(model.to(device), device_ids=[device.index] if use_gpu else None)

        return WorkerContext(
            rank=self.ranks.rank,
            world=self.ranks.size,
            device=device,
            prepare_model=prepare,
            stop_requested=sigterm_received.is_set,
        )


_joined: list[Session] = []  # this process's MPI job while `session` is open (one at most)


@contextmanager
def session(ranks: Ranks) -> Iterator[Session]:
    """The store every rank meets in, and the default process group built on it (destroyed on exit).

    Under mpirun a TCPStore rank 0 hosts at MASTER_ADDR:MASTER_PORT; under torchrun the one its rendezvous made.
    """
    import torch
    import torch.distributed as dist

    if ranks.launcher == "torchrun":
        store = torchrun.store(START_TIMEOUT)
    else:
        address, port = rendezvous(ranks)
        # What torchrun would set: DeepSpeed reads LOCAL_RANK (and checks it against OMPI_COMM_WORLD_LOCAL_RANK).
        os.environ.update(RANK=str(ranks.rank), WORLD_SIZE=str(ranks.size), LOCAL_RANK=str(ranks.local_rank))
        store = dist.TCPStore(  # type: ignore[attr-defined]  # exported at runtime, absent from torch's type stubs
            address, port, ranks.size, is_master=ranks.rank == 0, timeout=START_TIMEOUT
        )
    backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend, store=store, rank=ranks.rank, world_size=ranks.size)
    _joined.append(Session(ranks, store))
    try:
        yield _joined[-1]
    finally:
        _joined.pop()
        dist.destroy_process_group()


def lead(loop: LoopConfig) -> None:
    """Rank 0, holding the lease: publish the LoopConfig and train as rank 0."""
    if not _joined:
        raise StepInputError(
            "--launcher=mpi and --launcher=torchrun run as ranks: start the step as `mpirun -np N python -m "
            "eksflow.llm.steps.train ...` or `torchrun --nproc-per-node N -m eksflow.llm.steps.train ...`"
        )
    _joined[-1].publish({"loop": loop.model_dump(mode="json")})
    train_worker(loop, _joined[-1].context(loop))


def main(argv: Sequence[str], ranks: Ranks, driver: Callable[[Sequence[str]], int]) -> int:
    """Every rank: meet the others; rank 0 runs `driver` (the step's own main), the others follow it.

    Arguments are parsed on every rank first, so bad ones fail alike everywhere before anyone waits for anyone.
    """
    try:
        args = Args.from_argv(argv)
    except (ValidationError, StepInputError):
        if ranks.rank == 0:
            return driver(argv)  # reports every problem and exits 2
        return EXIT_BAD_INPUT
    if args.launcher != ranks.launcher:
        if ranks.size == 1 and args.launcher not in ("mpi", "torchrun"):
            return driver(argv)  # `mpirun -np 1` around a plain trainer
        if ranks.rank == 0:
            print(
                f"error: --launcher={args.launcher} under {ranks.starter} would start {ranks.size} trainers on the "
                f"same checkpoints; pass --launcher={ranks.launcher}",
                file=sys.stderr,
            )
        return EXIT_BAD_INPUT
    try:
        with session(ranks) as joined:
            if ranks.rank == 0:
                return _lead(joined, argv, driver)
            code = _follow(joined)
    except StepInputError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    _leave(code)


def _leave(code: int) -> NoReturn:
    """A follower's end: its output flushed, the process ends without the interpreter's teardown.

    As a multiprocessing child does. gloo's worker threads release a collective's tensors just after the caller has
    its result. A follower that returns from the last all-reduce and exits at once can have Python finalizing while
    such a thread still holds one, and the thread, needing the GIL to free it, is ended by pthread_exit inside C++:
    the rank aborts with "terminate called without an active exception" (exit 134) after training finished, and the
    job fails. Rank 0 exits normally: its checkpoint and outputs come after its last collective, and its atexit
    handlers (logging, MLflow) matter.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _lead(joined: Session, argv: Sequence[str], driver: Callable[[Sequence[str]], int]) -> int:
    code = EXIT_FAILED
    try:
        code = driver(argv)
        return code
    finally:
        if not joined.published:  # stopped before training: release the other ranks with this exit code
            joined.publish({"exit": code or EXIT_FAILED})


def _follow(joined: Session) -> int:
    message = joined.wait()
    if "exit" in message:
        return int(message["exit"])
    signal.signal(signal.SIGTERM, _on_sigterm)
    loop = LoopConfig.model_validate(message["loop"])
    train_worker(loop, joined.context(loop))
    return 0


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    sigterm_received.set()
