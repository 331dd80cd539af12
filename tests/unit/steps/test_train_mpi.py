"""`--launcher=mpi`: ranks and rendezvous from mpirun's environment, and the ways it refuses before any rank waits."""

import os
import subprocess
import sys

import pytest

from eksflow.llm.steps.common import strategies
from eksflow.llm.steps.train import mpi
from eksflow.runtime.args import StepInputError
from eksflow.runtime.ports import free_port

# One rank of a 2-rank job whose driver stops before training with exit code 7; the interpreter's teardown says so.
RANK = """
import atexit, sys
from eksflow.llm.steps.train import mpi
atexit.register(lambda: print("interpreter teardown", flush=True))
rank = int(sys.argv[1])
sys.exit(mpi.main(sys.argv[2:], mpi.Ranks(rank, 2, rank, 2), lambda argv: 7))
"""


def test_ranks_come_from_open_mpi_or_hydra_and_are_none_outside_mpirun():
    ompi = {"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "16", "OMPI_COMM_WORLD_LOCAL_RANK": "3",
            "OMPI_COMM_WORLD_LOCAL_SIZE": "8"}  # fmt: skip
    assert mpi.ranks_from_env(ompi) == mpi.Ranks(rank=3, size=16, local_rank=3, local_size=8)
    hydra = {"PMI_RANK": "1", "PMI_SIZE": "2"}  # MPICH / Intel MPI without local-rank variables: one host
    assert mpi.ranks_from_env(hydra) == mpi.Ranks(rank=1, size=2, local_rank=1, local_size=2)
    assert mpi.ranks_from_env({}) is None


def test_ranks_come_from_torchrun_only_with_its_run_id_and_before_an_mpi_environment_around_it():
    worker = {
        "TORCHELASTIC_RUN_ID": "none", "RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "job-node-0-0.job", "MASTER_PORT": "29400", "TORCHELASTIC_USE_AGENT_STORE": "True",
    }  # fmt: skip
    assert mpi.ranks_from_env(worker) == mpi.Ranks(3, 4, 1, 2, launcher="torchrun")
    # torchrun started by mpirun (one agent per node): its workers are torchrun's, not mpirun's ranks
    around = {**worker, "OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2"}
    assert mpi.ranks_from_env(around).launcher == "torchrun"
    no_run_id = {k: v for k, v in worker.items() if k != "TORCHELASTIC_RUN_ID"}
    assert mpi.ranks_from_env(no_run_id) is None  # RANK and WORLD_SIZE alone are anyone's (mpi.session sets them)
    assert mpi.ranks_from_env({**worker, "LOCAL_WORLD_SIZE": ""}) is None


def test_rendezvous_defaults_to_this_host_only_when_every_rank_is_on_it():
    one_host, two_hosts = mpi.Ranks(0, 2, 0, 2), mpi.Ranks(0, 16, 0, 8)
    assert mpi.rendezvous(one_host, {}) == ("127.0.0.1", mpi.DEFAULT_PORT)
    assert mpi.rendezvous(two_hosts, {"MASTER_ADDR": "job-worker-0.job", "MASTER_PORT": "29500"}) == (
        "job-worker-0.job",
        29500,
    )
    with pytest.raises(StepInputError, match="MASTER_ADDR is not set and the 16 ranks span hosts"):
        mpi.rendezvous(two_hosts, {})
    with pytest.raises(StepInputError, match="MASTER_PORT='http' is not a TCP port"):
        mpi.rendezvous(one_host, {"MASTER_PORT": "http"})


def driver_never_called(argv):
    raise AssertionError("rank 0's driver ran on another rank")


def test_bad_arguments_and_another_launcher_exit_2_on_every_rank_without_meeting(tmp_path, capsys):
    follower, leader = mpi.Ranks(1, 2, 1, 2), mpi.Ranks(0, 2, 0, 2)
    assert mpi.main(["--max-steps=0"], follower, driver_never_called) == 2  # rank 0 prints the reasons
    good = [f"--dataset-dir={tmp_path}", "--base-model=m", f"--output-dir={tmp_path}", f"--outputs-dir={tmp_path}"]
    assert mpi.main([*good, "--launcher=ray"], follower, driver_never_called) == 2
    assert mpi.main([*good, "--launcher=ray"], leader, driver_never_called) == 2
    assert "--launcher=ray under mpirun would start 2 trainers on the same checkpoints" in capsys.readouterr().err
    assert mpi.main([*good, "--launcher=local"], mpi.Ranks(0, 1, 0, 1), lambda argv: 7) == 7  # `mpirun -np 1`
    under_torchrun = mpi.Ranks(0, 2, 0, 2, launcher="torchrun")
    assert mpi.main([*good, "--launcher=mpi"], under_torchrun, driver_never_called) == 2
    err = capsys.readouterr().err
    assert "--launcher=mpi under torchrun would start 2 trainers" in err and "pass --launcher=torchrun" in err


def test_followers_exit_with_rank_0s_code_and_without_the_interpreters_teardown(tmp_path):
    """A follower's gloo threads may still hold the last collective's tensors when it is done, and Python
    finalizing under them aborts the rank (mpi._leave); rank 0 tears down as any process does."""
    good = [f"--dataset-dir={tmp_path}", "--base-model=m", f"--output-dir={tmp_path}", f"--outputs-dir={tmp_path}"]
    env = {**os.environ, "MASTER_PORT": str(free_port())}
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", RANK, str(rank), *good, "--launcher=mpi"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in (0, 1)
    ]
    (leader, _), (follower, _) = (rank.communicate(timeout=120) for rank in ranks)
    assert [rank.returncode for rank in ranks] == [7, 7], leader + follower
    assert "interpreter teardown" in leader
    assert "interpreter teardown" not in follower


def test_zero3_keeps_about_two_layers_gathered_when_the_layer_size_is_known():
    plan = strategies.Plan("deepspeed", 3, False, "")
    config = strategies.deepspeed_config(
        plan, micro_batch_size=1, grad_accum_steps=1, max_grad_norm=1.0, bf16=False, layer_params=3_500_000
    )
    zero = config["zero_optimization"]
    assert zero["stage3_max_live_parameters"] == zero["stage3_max_reuse_distance"] == 7_000_000
    assert zero["stage3_prefetch_bucket_size"] == 3_500_000
    stage2 = strategies.deepspeed_config(
        strategies.Plan("deepspeed", 2, False, ""),
        micro_batch_size=1,
        grad_accum_steps=1,
        max_grad_norm=1.0,
        bf16=False,
        layer_params=3_500_000,
    )
    assert "stage3_max_live_parameters" not in stage2["zero_optimization"]
