"""One writer per run (docs/reliability.md CK7), run identity, rank-0-only writes and the durable s3 copy."""

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import boto3
import pytest
import torch

from eksflow.llm.steps.common import checkpoints, lease
from eksflow.llm.steps.train import state
from eksflow.llm.steps.train import step as train
from eksflow.runtime import nodes
from eksflow.runtime.args import StepInputError


def test_second_writer_is_refused_while_the_first_lives(tmp_path):
    first = lease.acquire(tmp_path, "run-a")
    with pytest.raises(lease.LeaseHeldError, match=f"pid {os.getpid()}"):
        lease.acquire(tmp_path, "run-a")
    first.release()
    lease.acquire(tmp_path, "run-a").release()  # released: the next writer gets it at once
    assert not (tmp_path / lease.LEASE_FILE).exists()


def test_lease_of_a_dead_process_is_taken_over(tmp_path):
    command = [sys.executable, "-c", "import os; print(os.getpid())"]
    dead = subprocess.run(command, check=True, capture_output=True, text=True)
    record = {"host": socket.gethostname(), "pid": int(dead.stdout), "run_name": "run-a", "token": "old"}
    (tmp_path / lease.LEASE_FILE).write_text(json.dumps(record))
    taken = lease.acquire(tmp_path, "run-a")
    assert json.loads(taken.path.read_text())["pid"] == os.getpid()


def test_lease_of_a_zombie_is_taken_over(tmp_path):
    """A trainer killed after its parent (a Slurm step's task on a requeued node) stays a zombie of a PID 1 that
    does not reap it: it holds nothing, and the requeued job's rank 0 on the same node takes over at once."""
    zombie = subprocess.Popen(["true"])
    os.waitid(os.P_PID, zombie.pid, os.WEXITED | os.WNOWAIT)  # returns once it has exited, leaving it unreaped
    assert Path(f"/proc/{zombie.pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z"
    try:
        record = {"host": socket.gethostname(), "pid": zombie.pid, "run_name": "run-a", "token": "old"}
        (tmp_path / lease.LEASE_FILE).write_text(json.dumps(record))  # a fresh heartbeat: only the state tells
        taken = lease.acquire(tmp_path, "run-a")
        assert json.loads(taken.path.read_text())["pid"] == os.getpid()
    finally:
        zombie.wait()


def test_lease_from_another_host_goes_stale_without_heartbeat(tmp_path):
    record = {"host": "other-node", "pid": 1, "run_name": "run-a", "token": "old"}
    path = tmp_path / lease.LEASE_FILE
    path.write_text(json.dumps(record))
    with pytest.raises(lease.LeaseHeldError, match="other-node"):
        lease.acquire(tmp_path, "run-a", ttl_s=60)
    old = time.time() - 120
    os.utime(path, (old, old))  # the other pod stopped heart-beating two minutes ago
    assert lease.acquire(tmp_path, "run-a", ttl_s=60).path == path


def test_a_holder_on_another_host_is_waited_for_until_its_heartbeat_stops_or_given_up_on(tmp_path, capsys):
    """A retry in a new pod meets the lease of a rank 0 killed with its node: it waits, then takes it over."""
    record = {"host": "lost-node", "pid": 1, "run_name": "run-a", "token": "old"}
    path = tmp_path / lease.LEASE_FILE
    path.write_text(json.dumps(record))
    last_beat = time.time() - 58
    os.utime(path, (last_beat, last_beat))  # its heartbeat stopped 58 s ago: stale at 60 s
    taken = lease.acquire(tmp_path, "run-a", ttl_s=60, wait_s=30)
    assert json.loads(taken.path.read_text())["pid"] == os.getpid()
    waited, took_over = capsys.readouterr().out.splitlines()  # waited first, then took over the stale lease
    assert "on lost-node" in waited and waited.endswith(
        "cannot check: waiting up to 30 s for its release or for its heartbeat to stop"
    )
    stale = rf"taking over stale lease {re.escape(str(path))}: no heartbeat for \d+ s \(> 60 s\)"
    assert re.fullmatch(stale, took_over), took_over  # its heartbeat stopped: taken over before the 30 s were up
    taken.release()
    path.write_text(json.dumps(record))  # a live holder on another host keeps beating: given up on, named
    with pytest.raises(lease.LeaseHeldError, match="lost-node"):
        lease.acquire(tmp_path, "run-a", ttl_s=60, wait_s=1.5)


def test_release_does_not_remove_a_lease_taken_over_meanwhile(tmp_path):
    """A writer that stalled past its TTL and was taken over must not free the lease its successor holds."""
    mine = lease.acquire(tmp_path, "run-a")
    successor = {"host": socket.gethostname(), "pid": os.getpid(), "run_name": "run-a", "token": "successor"}
    (tmp_path / lease.LEASE_FILE).write_text(json.dumps(successor))  # taken over while this one stalled
    mine.release()
    assert json.loads((tmp_path / lease.LEASE_FILE).read_text()) == successor
    with pytest.raises(lease.LeaseHeldError, match=f"pid {os.getpid()}"):  # still one writer: a third is refused
        lease.acquire(tmp_path, "run-a")


def test_another_run_never_resumes_these_checkpoints(tmp_path):
    lease.claim_run(tmp_path, "wf-1")
    lease.claim_run(tmp_path, "wf-1")  # a retry of the same workflow resumes
    with pytest.raises(lease.RunMismatchError, match="--run-name=wf-1"):
        lease.claim_run(tmp_path, "wf-2")


def step_argv(tmp_path, run_name):
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    (data / "train.jsonl").write_text(json.dumps({"prompt": "p", "completion": "c"}) + "\n")
    return [
        f"--dataset-dir={data}",
        "--base-model=smollm2-135m-instruct",
        f"--output-dir={tmp_path / 'out'}",
        f"--outputs-dir={tmp_path / 'outputs'}",
        f"--run-name={run_name}",
        "--launcher=local",
    ]


def test_step_exits_2_for_another_runs_checkpoints_and_1_for_a_live_writer(tmp_path, capsys):
    root = tmp_path / "out" / "checkpoints"
    lease.claim_run(root, "wf-1")
    assert train.main(step_argv(tmp_path, "wf-2")) == 2
    assert "belong to run 'wf-1'" in capsys.readouterr().err
    held = lease.acquire(root, "wf-1")
    assert train.main(step_argv(tmp_path, "wf-1")) == 1  # retried by the workflow; the holder may be a zombie
    assert "another trainer is writing these checkpoints" in capsys.readouterr().err
    held.release()


def test_only_rank_0_writes_checkpoints(tmp_path):
    with pytest.raises(RuntimeError, match="only rank 0 writes"):
        state.save_checkpoint(
            tmp_path,
            rank=1,
            model=None,
            weights={},
            optimizer_state={},
            scheduler=None,
            strategy="fsdp",
            metrics={"step": 1},
        )
    assert list(tmp_path.iterdir()) == []


def test_a_checkpoint_from_before_name_keyed_optimizer_state_is_refused(tmp_path):
    import torch

    torch.save({"step": 2, "optimizer": {"state": {0: {}}, "param_groups": []}}, tmp_path / state.STATE_FILE)
    with pytest.raises(StepInputError, match=r"older eksflow .* or delete "):
        state.load_adapter(tmp_path, model=None)


def write_step(step):
    def write(folder):
        (folder / "adapter").mkdir()
        (folder / "adapter" / "weights.bin").write_bytes(bytes([step]) * 4096)
        (folder / "state.json").write_text(json.dumps({"step": step}))

    return write


def test_durable_copy_writes_the_marker_last_and_restores_the_newest(tmp_path, s3_env):
    boto3.client("s3").create_bucket(Bucket="ckpt")
    local = tmp_path / "local"
    copy = checkpoints.DurableCopy("s3://ckpt/runs/wf-1")
    for step in (2, 4):
        copy.submit(checkpoints.commit(local, step, write_step(step)))
    assert copy.close() == []
    keys = [o["Key"] for o in boto3.client("s3").list_objects_v2(Bucket="ckpt")["Contents"]]
    assert "runs/wf-1/step-00000004/COMMITTED" in keys
    assert "runs/wf-1/step-00000004/manifest.json" in keys
    # An upload interrupted before its marker (a killed pod) is not a checkpoint.
    s3 = boto3.client("s3")
    s3.put_object(Bucket="ckpt", Key="runs/wf-1/step-00000006/state.json", Body=b"{}")

    fresh = tmp_path / "new-node"
    restored = checkpoints.restore_latest("s3://ckpt/runs/wf-1", fresh)
    assert restored.step == 4
    assert checkpoints.latest(fresh).step == 4


def test_durable_copy_outage_never_raises_into_training(tmp_path, s3_env):
    copy = checkpoints.DurableCopy("s3://no-such-bucket/x")
    copy.submit(checkpoints.commit(tmp_path, 2, write_step(2)))
    errors = copy.close()
    assert len(errors) == 1
    assert "step-00000002" in errors[0]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_a_gpu_this_machine_lacks_is_refused_as_bad_input_before_anything_starts(tmp_path, capsys):
    assert train.main([*step_argv(tmp_path, "wf-1"), "--strategy=deepspeed", "--use-gpu=true"]) == 2
    assert "--use-gpu=false" in capsys.readouterr().err  # names what to use instead
    assert not (tmp_path / "out").exists()  # no lease, no checkpoint folder, no Ray


def test_a_holder_whose_node_was_lost_is_taken_over_at_once_and_one_on_a_live_node_is_not(
    tmp_path, monkeypatch, capsys
):
    """The Ray head's node lost mid-training: its retry in a new head pod finds the lease of a driver on another
    host, still fresh. Its node is listed lost (every process on it killed), so no wait for the heartbeat to stop."""
    lost = tmp_path / "lost-nodes"
    lost.write_text("node-1\n")
    monkeypatch.setenv(nodes.LOST_NODES_ENV, str(lost))
    monkeypatch.setenv(nodes.NODE_NAME_ENV, "node-3")
    path = tmp_path / lease.LEASE_FILE
    record = {"host": "train-head-1a2b3c", "node": "node-2", "pid": 7, "run_name": "run-a", "token": "old"}
    path.write_text(json.dumps(record))  # a fresh heartbeat, on a node that lives
    with pytest.raises(lease.LeaseHeldError, match="train-head-1a2b3c"):
        lease.acquire(tmp_path, "run-a", wait_s=0)
    path.write_text(json.dumps({**record, "node": "node-1"}))
    taken = lease.acquire(tmp_path, "run-a", wait_s=0)
    assert json.loads(taken.path.read_text())["node"] == "node-3"  # the newcomer's own node, for the next one
    assert "ran on node node-1, which was lost with it" in capsys.readouterr().out
