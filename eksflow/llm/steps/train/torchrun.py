"""`--launcher=torchrun`: the train step as one worker of torchrun (a Kubeflow TrainJob's pods run it so).

    torchrun --nnodes 2 --nproc-per-node 1 -m eksflow.llm.steps.train --launcher=torchrun --strategy=deepspeed ...

In a TrainJob the Trainer's torch plugin gives each node's pod PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK,
PET_MASTER_ADDR (node 0's pod) and PET_MASTER_PORT, which torchrun reads as its options; the agents meet in the
TCPStore node 0's agent hosts there (torchrun's static rendezvous, with a fixed node count) and each starts its
workers with RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT, and
TORCHELASTIC_USE_AGENT_STORE telling them that store is the agent's. The workers reach it through torch's env://
rendezvous (a client of the agent's store), build the process group on it, and from there run as mpirun's ranks do
(eksflow.llm.steps.train.mpi): rank 0 drives, every rank trains, rank 0 writes checkpoints and outputs.

SIGTERM (kubelet stopping the pod, a Spot notice): torchrun's agent forwards it to its workers and waits for them up
to its shutdown timeout (30 s) before SIGKILL; each worker's handler asks for a checkpoint at the next step boundary,
as under mpirun, so the stop costs no step when a step and a commit take less than that. The agent itself then exits
with 1 (its SignalException), not the step's 143: a retry follows either way (only 2 is not retried).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any

RUN_ID_ENV = "TORCHELASTIC_RUN_ID"  # set by torchrun's agent in every worker: the mark of running under torchrun


def ranks_from_env(env: Mapping[str, str]) -> tuple[int, int, int, int] | None:
    """(rank, world size, local rank, local world size) from the environment torchrun gives a worker; None outside."""
    names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
    if RUN_ID_ENV not in env or not all(env.get(name, "").isdigit() for name in names):
        return None
    rank, size, local_rank, local_size = (int(env[name]) for name in names)
    return rank, size, local_rank, local_size


def store(timeout: timedelta) -> Any:
    """The store torchrun's rendezvous made (torch's env:// rendezvous): the agent's, or one rank 0 hosts."""
    import torch.distributed as dist

    found, _, _ = next(dist.rendezvous("env://", timeout=timeout))  # type: ignore[attr-defined]
    return found
