"""Training across simulated nodes: the RayJob as KubeRay runs it, every pod with its own network namespace and address.

The RayJob is what the launcher renders for `cluster.nodes=2` on the CPU profile (a head and two worker pods), run
by the local executor with two simulated nodes (eksflow/local/sim_nodes.py): `ray start` in each pod, the workers
joining the head at its pod address, the train step as the entrypoint in the head pod, gloo between the workers'
eth0 addresses (GLOO_SOCKET_IFNAME from the profile). Each run is the real train step on the session's tiny random
Llama. Needs root and iproute2; the module skips with the reason otherwise (CI runs as root).
"""

from __future__ import annotations

import contextlib
import io
import ipaddress
import json
import math
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
import yaml
from rich.console import Console

from eksflow.launchers import mpijob, rayjob, trainjob
from eksflow.llm.steps.common import checkpoints
from eksflow.llm.steps.train.state import read_metrics
from eksflow.local import run_workflow
from eksflow.local.mpi_pods import INSTALL_SSHD, sshd
from eksflow.local.pod_network import POD_RANGE, REGISTRY, unavailable
from eksflow.local.watchdog import netns_pids
from tests.e2e.conftest import training_folder
from tests.e2e.test_train_zero import train_args
from tests.flagship import config

ROOT = Path(__file__).resolve().parents[2]
RESUMED = r"rank 0: resumed from \S+ \(step (\d+)\)"  # the loop's line when it starts from a checkpoint
pytestmark = [pytest.mark.slow, pytest.mark.skipif(bool(unavailable()), reason=unavailable() or "")]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, tiny_llama):
    return training_folder(tmp_path_factory.mktemp("nodes"), tiny_llama)


def run_on_nodes(
    state: Path,
    argv: list[str],
    *,
    retries: int = 0,
    during=None,
    launcher: str = "rayjob",
    nodes: int = 2,
    backoff: str = "",
):
    """The rendered RayJob (or MPIJob, or TrainJob) of `cluster.nodes=2` in a workflow of one task, run with `nodes`
    simulated nodes; `backoff`: the retry's delay (a Go duration), which the failed attempt's message shows during."""
    cfg = config(["cluster.nodes=2", f"cluster.launcher={launcher}"])
    if launcher == "mpijob":
        manifest = mpijob.manifest(cfg, "train", "eksflow.llm.steps.train", 2, argv, ("final_loss",))
        success, failure = mpijob.SUCCESS, mpijob.failure(cfg)
    elif launcher == "trainjob":
        manifest = trainjob.manifest(cfg, "train", "eksflow.llm.steps.train", argv)
        success, failure = trainjob.success(cfg.cluster), trainjob.FAILURE
    else:
        manifest = rayjob.manifest(cfg, "train", "eksflow.llm.steps.train", argv)
        success, failure = rayjob.SUCCESS, rayjob.FAILURE
    template = {
        "name": "train",
        "retryStrategy": {
            "limit": retries,
            "retryPolicy": "Always",
            **({"backoff": {"duration": backoff}} if backoff else {}),
        },
        "resource": {
            "action": "create",
            "successCondition": success,
            "failureCondition": failure,
            "manifest": yaml.safe_dump(manifest, sort_keys=False),
        },
    }
    workflow = {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Workflow",
        "metadata": {"generateName": "nodes-"},
        "spec": {
            "entrypoint": "main",
            "volumes": [{"name": "fsx", "persistentVolumeClaim": {"claimName": "fsx-claim"}}],
            "templates": [template, {"name": "main", "dag": {"tasks": [{"name": "train", "template": "train"}]}}],
        },
    }
    if during is not None:
        threading.Thread(target=during, args=(state,), daemon=True).start()
    result = run_workflow(workflow, state, cwd=ROOT, console=Console(file=io.StringIO()), nodes=nodes)
    status = json.loads((result.run_dir / "status.json").read_text())["status"]["nodes"]["train"]
    log = (result.run_dir / "logs" / "train.log").read_text(errors="replace")
    return result.nodes["train"], status, log


def leftovers() -> list[str]:
    """Pod namespaces, bridges and network records of simulated nodes still on this machine."""
    netns = subprocess.run(["ip", "netns", "list"], check=False, capture_output=True, text=True).stdout.split()
    links = subprocess.run(["ip", "-o", "link", "show"], check=False, capture_output=True, text=True).stdout
    return (
        [n for n in netns if re.fullmatch(r"ef[0-9a-f]{6}-\d+", n)]
        + re.findall(r"\befb[0-9a-f]{6}\b", links)
        + ([p.name for p in REGISTRY.iterdir() if p.is_dir()] if REGISTRY.is_dir() else [])
    )


def test_fsdp_across_two_nodes_survives_a_lost_worker_node_by_resuming_on_its_replacement(workdir, tmp_path, capsys):
    """FSDP with one training worker per node, gloo between their pod addresses. A worker's node is lost
    mid-training (its pods' processes killed and namespaces gone, as a reclaimed Spot instance): a replacement node
    joins as Karpenter would add one, and Ray Train restarts the worker group in the same attempt (max_failures=1)
    from the last committed checkpoint, losing at most one checkpoint interval; Argo's retry is not needed."""
    before = leftovers()
    out = tmp_path / "train"
    every, steps = 2, 12
    lost: dict[str, object] = {}

    def lose_a_worker_node(state: Path) -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not checkpoints.committed(out / "checkpoints"):
            time.sleep(0.05)
        (status_file,) = (state / "runs").glob("*/status.json")
        pods = json.loads(status_file.read_text())["status"]["nodes"]["train"]["pods"]
        head_node = pods[0]["hostNodeName"]
        victim = next(p for p in pods if p["hostNodeName"] != head_node)
        # steps surely done when the node goes: its progress file (written every 2 s) or its last commit, if later.
        # Training goes on until the kill, and rank 0 (on the head's node) may finish a commit after it.
        progress = (status_file.parent / "tasks" / "train" / "progress").read_text().split("/")[0]
        committed = checkpoints.committed(out / "checkpoints")[-1].step
        lost.update(node=victim["hostNodeName"], done=max(int(progress or 0), committed), committed=committed)
        lose_node(pods, victim["hostNodeName"])
        lost["at"] = time.monotonic()
        while time.monotonic() < deadline and not (resumed := re.search(RESUMED, train_log(state))):
            time.sleep(0.05)
        while time.monotonic() < deadline and checkpoints.committed(out / "checkpoints")[-1].step <= int(resumed[1]):
            time.sleep(0.05)
        lost["recovered"] = time.monotonic()  # the restarted workers committed a step past the one they resumed from

    argv = train_args(workdir, out, "fsdp", launcher="ray", max_steps=steps, checkpoint_every=every)
    node, status, log = run_on_nodes(tmp_path / "state", argv, retries=1, during=lose_a_worker_node)
    assert "recovered" in lost, f"the drill did not see the loss and the recovery: {lost}"
    assert node.phase == "Succeeded", f"{node.message}\n{log[-3000:]}"
    assert node.retries == 0, f"Ray Train restarts the worker group within the attempt: {node.message}\n{log[-4000:]}"
    assert "[FailurePolicy] RETRY" in log and "Source: worker group" in log, log[-3000:]  # Ray Train's own decision
    assert "worker pods replaced" in node.message and lost["node"] in node.message, node.message

    # the pods at the end: the head, and one training worker on each node, the lost one's replacement among them
    pods = status["pods"]
    assert [p["role"] for p in pods] == ["head", "cpu", "cpu"], pods
    workers = [p for p in pods if p["role"] == "cpu"]
    assert len({p["hostNodeName"] for p in workers}) == 2, "one training worker per node"
    nodes = {p["hostNodeName"] for p in pods}
    assert lost["node"] not in nodes and "node-3" in nodes, pods  # the replacement node took the lost one's place
    assert status["hostNodeName"] == pods[0]["hostNodeName"]  # the driver runs on the head
    addresses = {p["podIP"] for p in pods}
    assert len(addresses) == 3 and all(ipaddress.ip_address(a) in POD_RANGE for a in addresses)
    # each rank ran in a worker pod: its own host name, resolving to its own pod address (the restart's, logged last)
    hosts = re.findall(r"rank (\d)/2: host (\S+ \S+)", log)
    assert len(hosts) == 4, log[-3000:]  # both ranks of both groups, each in its place: Ray's dedup folds none
    ranks = dict(hosts)
    assert set(ranks.values()) == {f"{p['name']} {p['podIP']}" for p in workers}, log[-3000:]
    assert "Reporting training result" not in log
    resumed = [int(s) for s in re.findall(RESUMED, log)]
    assert resumed, log[-3000:]
    # the restart began at a checkpoint no older than the one committed before the loss, and at most one interval
    # behind the steps surely done then
    assert int(lost["committed"]) <= resumed[0] and int(lost["done"]) - resumed[0] <= every, (lost, resumed)
    committed = checkpoints.committed(out / "checkpoints")
    assert committed[-1].step == steps and 0 < read_metrics(committed[-1].path)["loss"] < 20
    assert leftovers() == before, "every pod, address and bridge goes with the run"
    with capsys.disabled():
        print(
            f"\nnode lost after step {lost['done']} or later: resumed from step {resumed[0]}; "
            f"{float(lost['recovered']) - float(lost['at']):.0f} s from the loss to the next new checkpoint"
        )


def lose_node(pods: list[dict[str, str]], node: str) -> None:
    """Node `node` goes at once, as a reclaimed Spot instance: its pods' namespaces vanish, then their processes."""
    for netns in pod_namespaces({p["podIP"] for p in pods if p["hostNodeName"] == node}):
        pids = netns_pids(netns)
        subprocess.run(["ip", "netns", "delete", netns], check=True)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def pod_namespaces(addresses: set[str]) -> list[str]:
    """The network namespaces of the pods holding `addresses` (what `ip -n NS addr` shows)."""
    found = []
    for netns in subprocess.run(["ip", "netns", "list"], check=False, capture_output=True, text=True).stdout.split():
        if re.fullmatch(r"ef[0-9a-f]{6}-\d+", netns):
            shown = subprocess.run(
                ["ip", "-n", netns, "-o", "-4", "addr"], check=False, capture_output=True, text=True
            ).stdout
            if any(f"inet {address}/" in shown for address in addresses):
                found.append(netns)
    return found


def give_a_worker_node_notice(state: Path) -> None:
    """Once training started, a Spot notice for a node of a training worker (not the head's)."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and "[train] 0/" not in train_log(state):
        time.sleep(0.05)
    (status_file,) = (state / "runs").glob("*/status.json")
    pods = json.loads(status_file.read_text())["status"]["nodes"]["train"]["pods"]
    victim = next(p for p in pods if p["hostNodeName"] != pods[0]["hostNodeName"])["hostNodeName"]
    notices = status_file.parent / "spot-notices"
    notices.mkdir(exist_ok=True)
    (notices / victim).touch()


PREEMPTION_COMMIT = re.compile(
    r"being preempted \(notice (\d)\); checkpoint step (\d+) committed"
    r"|deadline is near; checkpoint step (\d+) committed"
)


def preemption_commits(log: str) -> list[tuple[str, int]]:
    """The commits a preemption made, in order: ("notice 1", step), ("notice 2", step), ("deadline", step)."""
    return [
        (f"notice {notice}" if notice else "deadline", int(step or near))
        for notice, step, near in PREEMPTION_COMMIT.findall(log)
    ]


def test_a_spot_notice_drains_the_ray_node_and_the_workers_commit_a_checkpoint_at_once(workdir, tmp_path, capsys):
    """A Spot interruption notice for a worker's node: its pods' preStop hook (which the RayJob's worker pods carry)
    drains their Ray node for preemption, Ray Train's PreemptionWatcher tells the workers, and their loop commits a
    checkpoint at once, then trains on; the node goes once the hook and the grace are over."""
    out = tmp_path / "train"
    steps = 60  # ~15 s of training: the notice comes at its start
    argv = train_args(workdir, out, "ddp", launcher="ray", max_steps=steps, checkpoint_every=steps, grad_accum_steps=8)
    node, _, log = run_on_nodes(tmp_path / "state", argv, during=give_a_worker_node_notice)
    assert node.phase == "Succeeded" and node.retries == 0, f"{node.message}\n{log[-3000:]}"
    assert "PreemptionWatcher: preemption detected" in log, log[-3000:]
    made = preemption_commits(log)
    assert made and made[0][0] == "notice 1" and 0 < made[0][1] < steps, log[-3000:]
    # the node's terminating signal, a grace after the notice, and its deadline commit too where training lasts
    assert [c.step for c in checkpoints.committed(out / "checkpoints")] == sorted({*(s for _, s in made), steps})
    with capsys.disabled():
        print(f"\nspot notice at the start of training: checkpoint committed at step {made[0][1]} of {steps}")


@pytest.mark.drill
def test_a_preempted_worker_node_commits_at_its_notice_its_terminating_signal_and_its_deadline(
    workdir, tmp_path, capsys
):
    """The Spot drill (`pytest -m drill`: minutes). Training outlasts the worker node's whole preemption: the notice
    (the preStop hook's drain) commits, the terminating signal 15 s later (`ray start` drains its node on SIGTERM)
    commits, and the last step boundary before that drain's deadline (30 s on, when `ray start` kills the node's
    processes) commits; Ray Train restarts the group on the replacement node from that last commit, so the node took
    at most the step under way with it, where it took every step since the notice."""
    out = tmp_path / "train"
    steps = 400  # longer than the preemption (~50 s from the notice to the node's end) at any speed seen here
    argv = train_args(workdir, out, "ddp", launcher="ray", max_steps=steps, checkpoint_every=steps, grad_accum_steps=8)
    node, _, log = run_on_nodes(tmp_path / "state", argv, during=give_a_worker_node_notice)
    assert node.phase == "Succeeded" and node.retries == 0, f"{node.message}\n{log[-3000:]}"
    made = preemption_commits(log)
    assert [kind for kind, _ in made] == ["notice 1", "notice 2", "deadline"], log[-5000:]
    resumed = [int(s) for s in re.findall(RESUMED, log)]
    assert resumed == [made[-1][1]], (made, resumed, log[-5000:])  # the group restarted from the deadline's commit
    assert "worker pods replaced" in node.message, node.message
    assert [c.step for c in checkpoints.committed(out / "checkpoints")] == [*(s for _, s in made), steps]
    with capsys.disabled():
        print(f"\npreempted worker node: commits at {made}; the replacement resumed from step {resumed[0]}")


@pytest.mark.drill
def test_a_partitioned_worker_node_is_lost_and_replaced_and_training_resumes(workdir, tmp_path, capsys):
    """The partition drill (`pytest -m drill`: minutes). After the first checkpoint a training worker's pod is cut
    off (`ip -n <its netns> link set eth0 down`: its processes live on). Ray waited for it for good; now its node,
    not heard from for the node monitor's 40 s, is lost as the node controller evicts a NotReady node's pods, a
    replacement node takes its worker pod, and Ray Train restarts the group from the checkpoint."""
    out, steps, every = tmp_path / "train", 300, 10  # training outlasts the monitor's grace and the replacement
    cut: dict[str, object] = {}

    def partition_a_worker(state: Path) -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not checkpoints.committed(out / "checkpoints"):
            time.sleep(0.05)
        (status_file,) = (state / "runs").glob("*/status.json")
        pods = json.loads(status_file.read_text())["status"]["nodes"]["train"]["pods"]
        victim = next(p for p in pods if p["role"] != "head")
        (netns,) = pod_namespaces({victim["podIP"]})
        cut.update(node=victim["hostNodeName"], committed=checkpoints.committed(out / "checkpoints")[-1].step)
        subprocess.run(["ip", "-n", netns, "link", "set", "eth0", "down"], check=True)

    argv = train_args(workdir, out, "ddp", launcher="ray", max_steps=steps, checkpoint_every=every)
    node, status, log = run_on_nodes(tmp_path / "state", argv, retries=0, during=partition_a_worker, nodes=3)
    assert node.phase == "Succeeded" and node.retries == 0, f"{node.message}\n{log[-3000:]}"
    assert f"on {cut['node']} (its pods unreachable for 40 s) -> " in node.message, node.message
    resumed = [int(s) for s in re.findall(RESUMED, log)]
    assert resumed and resumed[0] >= int(cut["committed"]), (cut, resumed)
    assert cut["node"] not in {p["hostNodeName"] for p in status["pods"]}
    assert checkpoints.committed(out / "checkpoints")[-1].step == steps
    with capsys.disabled():
        print(f"\npartitioned worker node {cut['node']}: {node.message}; resumed from step {resumed[0]}")


@pytest.mark.drill
def test_the_head_nodes_loss_is_retried_and_the_retry_takes_the_dead_drivers_lease_at_once(workdir, tmp_path, capsys):
    """The head drill (`pytest -m drill`). The head's node lost after the first checkpoint takes the driver, which
    holds the checkpoint lease, with it: the attempt fails and Argo's retry starts a new head on another node. Its
    driver took the lease over only once the dead one's heartbeat had stopped (95 s); the lost node is recorded once
    everything on it is killed, so the retry takes the lease of a holder that ran there at once."""
    out, steps, every = tmp_path / "train", 40, 2
    lost: dict[str, object] = {}

    def lose_the_head_node(state: Path) -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not checkpoints.committed(out / "checkpoints"):
            time.sleep(0.05)
        (status_file,) = (state / "runs").glob("*/status.json")
        pods = json.loads(status_file.read_text())["status"]["nodes"]["train"]["pods"]
        lost.update(node=pods[0]["hostNodeName"], committed=checkpoints.committed(out / "checkpoints")[-1].step)
        lose_node(pods, pods[0]["hostNodeName"])

    argv = train_args(workdir, out, "ddp", launcher="ray", max_steps=steps, checkpoint_every=every)
    node, _, log = run_on_nodes(tmp_path / "state", argv, retries=1, during=lose_the_head_node, nodes=3)
    assert node.phase == "Succeeded" and node.retries == 1, f"{node.message}\n{log[-3000:]}"
    assert f"ran on node {lost['node']}, which was lost with it" in log, log[-3000:]
    assert "waiting up to" not in log  # no wait for the dead driver's heartbeat
    resumed = [int(s) for s in re.findall(RESUMED, log)]
    assert resumed and resumed[-1] >= int(lost["committed"]), (lost, resumed)
    assert checkpoints.committed(out / "checkpoints")[-1].step == steps
    with capsys.disabled():
        print(f"\nhead node {lost['node']} lost: the retry took the lease at once and resumed from step {resumed[-1]}")


def train_log(state: Path) -> str:
    """The run's train task log so far ("" before it has one)."""
    found = list((state / "runs").glob("*/logs/train.log"))
    return found[0].read_text(errors="replace") if found else ""


@pytest.mark.skipif(sshd() is None, reason=INSTALL_SSHD)
def test_zero2_across_two_nodes_as_the_mpi_operator_runs_it_over_ssh(workdir, tmp_path):
    """The MPIJob of `cluster.nodes=2` on CPU: a worker pod per node running sshd, the launcher's mpirun starting one
    rank in each over ssh with the operator's hostfile (`<job>-worker-<i>.<job>`, resolving to the pods' addresses),
    DeepSpeed ZeRO-2 between them over gloo, MASTER_ADDR the first worker's name."""
    before = leftovers()
    out = tmp_path / "train"
    argv = train_args(workdir, out, "deepspeed", launcher="mpi", max_steps=4, checkpoint_every=4, zero_stage=2)
    node, status, log = run_on_nodes(tmp_path / "state", argv, launcher="mpijob")
    assert node.phase == "Succeeded", f"{node.message}\n{log[-3000:]}"
    ranks = re.findall(r"rank (\d)/2: host (\S+) (\S+)", log)
    assert {rank for rank, _, _ in ranks} == {"0", "1"}, log[-3000:]
    # the operator's pod names, <job>-worker-<i>, each with its own pod address
    assert {re.sub(r".*-train-0-worker-", "", host) for _, host, _ in ranks} == {"0", "1"}, ranks
    assert len({address for _, _, address in ranks}) == 2
    assert all(ipaddress.ip_address(address) in POD_RANGE for _, _, address in ranks)
    assert "strategy: deepspeed (strategy=deepspeed (ZeRO-2)" in log, log[-3000:]
    assert checkpoints.committed(out / "checkpoints")[-1].step == 4
    pods = status["pods"]
    assert [p["role"] for p in pods] == ["launcher", "worker", "worker"], pods
    assert len({p["hostNodeName"] for p in pods if p["role"] == "worker"}) == 2, "one worker pod per node"
    assert status["hostNodeName"] == pods[0]["hostNodeName"]  # mpirun runs in the launcher pod
    assert leftovers() == before, "every pod, address and bridge goes with the run"


@pytest.mark.drill
@pytest.mark.skipif(sshd() is None, reason=INSTALL_SSHD)
def test_an_mpijob_whose_worker_node_is_lost_is_retried_from_its_checkpoint(workdir, tmp_path, capsys):
    """The MPI node-loss drill (`pytest -m drill`: minutes, not in `make test`). A worker's node lost after the first
    commit fails the MPIJob (mpirun has no in-job retry, and may exit 0: the launcher's wrapper fails it then); Argo's
    retry resumes from that checkpoint on the node left and a replacement, once rank 0's checkpoint lease is free:
    released by rank 0 on the node left, or, when rank 0 was lost with the node, once its heartbeat has stopped."""
    before = leftovers()
    out = tmp_path / "train"
    steps, every = 8, 2
    lost: dict[str, object] = {}

    def lose_a_worker_node(state: Path) -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not checkpoints.committed(out / "checkpoints"):
            time.sleep(0.05)
        (status_file,) = (state / "runs").glob("*/status.json")
        pods = json.loads(status_file.read_text())["status"]["nodes"]["train"]["pods"]
        victim = next(p for p in pods if p["role"] == "worker" and p["hostNodeName"] != pods[0]["hostNodeName"])
        lose_node(pods, victim["hostNodeName"])
        lost["at"] = time.monotonic()
        lost.update(
            node=victim["hostNodeName"], pod=victim["name"], done=checkpoints.committed(out / "checkpoints")[-1].step
        )

    argv = train_args(
        workdir, out, "deepspeed", launcher="mpi", max_steps=steps, checkpoint_every=every, zero_stage=2,
        grad_accum_steps=8,
    )  # fmt: skip
    node, status, log = run_on_nodes(tmp_path / "state", argv, retries=1, during=lose_a_worker_node, launcher="mpijob")
    assert node.phase == "Succeeded" and node.retries == 1, f"{node.message}\n{log[-3000:]}"
    ranks = re.findall(r"rank (\d)/2: host (\S+) (\S+)", log)
    assert {rank for rank, _, _ in ranks} == {"0", "1"}, log[-3000:]
    # the operator's pod names, <job>-worker-<i>, each with its own pod address
    assert {re.sub(r".*-train-\d-worker-", "", host) for _, host, _ in ranks} == {"0", "1"}, ranks
    assert all(ipaddress.ip_address(address) in POD_RANGE for _, _, address in ranks)
    assert "strategy: deepspeed (strategy=deepspeed (ZeRO-2)" in log, log[-3000:]
    resumed = [int(s) for s in re.findall(RESUMED, log)]
    assert resumed == [lost["done"]], log[-3000:]
    assert checkpoints.committed(out / "checkpoints")[-1].step == steps
    pods = status["pods"]  # the retry's: the launcher, and a worker on the node left and on the replacement
    assert [p["role"] for p in pods] == ["launcher", "worker", "worker"], pods
    workers = {p["hostNodeName"] for p in pods if p["role"] == "worker"}
    assert len(workers) == 2 and lost["node"] not in workers and "node-3" in workers, pods
    assert status["hostNodeName"] == pods[0]["hostNodeName"]  # mpirun runs in the launcher pod
    assert leftovers() == before, "every pod, address and bridge goes with the run"
    # Rank 0 runs in worker 0 (--map-by slot). Lost with it, it leaves its lease held; on the node left it releases
    # the lease if it gets to exit, or (stuck in a collective with the lost rank) dies with its pod holding it.
    took_over = [line.split(": ", 1)[1] for line in log.splitlines() if "taking over stale lease" in line]
    assert len(took_over) <= 1 and (took_over or not str(lost["pod"]).endswith("-worker-0")), (lost, took_over)
    lease_note = took_over[0] if took_over else "released by rank 0, on the node left"
    with capsys.disabled():
        print(
            f"\nMPI worker node lost after checkpoint step {lost['done']}: the retry resumed from step {resumed[0]}; "
            f"{time.monotonic() - float(str(lost['at'])):.0f} s from the loss to the end of training; the lease: "
            f"{lease_note}; the lost attempt's mpirun "
            + ("exited 0, failed by the wrapper" if "mpirun exited 0 but" in log else "failed by itself")
        )


def pod_logs(state: Path) -> str:
    """What the run's pods other than a task's own process wrote (a TrainJob's nodes 1..), one after the other."""
    return "".join(p.read_text(errors="replace") for p in sorted((state / "runs").glob("*/tasks/*/pods/*.log")))


def test_zero2_across_two_nodes_as_the_kubeflow_trainer_runs_it_with_torchrun(workdir, tmp_path):
    """The TrainJob of `cluster.launcher=trainjob` and `cluster.nodes=2` on CPU: a pod per node
    (`<job>-node-0-<i>`), torchrun in each with the Trainer's PET_* (PET_MASTER_ADDR node 0's FQDN under the job's
    headless Service, resolving through the run's /etc/hosts to its pod address), the agents meeting in node 0's
    rendezvous store, DeepSpeed ZeRO-2 over gloo between the two pod addresses; rank 0's progress in the TrainJob's
    trainerStatus through the status endpoint the executor serves on the pods' bridge."""
    before = leftovers()
    out = tmp_path / "train"
    argv = train_args(workdir, out, "deepspeed", launcher="torchrun", max_steps=4, checkpoint_every=4, zero_stage=2)
    node, status, log = run_on_nodes(tmp_path / "state", argv, launcher="trainjob")
    assert node.phase == "Succeeded", f"{node.message}\n{log[-3000:]}"
    ranks = re.findall(r"rank (\d)/2: host (\S+) (\S+)", log + pod_logs(tmp_path / "state"))
    assert sorted(rank for rank, _, _ in ranks) == ["0", "1"], log[-3000:]
    pods = status["pods"]
    assert [p["role"] for p in pods] == ["node", "node"] and len({p["hostNodeName"] for p in pods}) == 2, pods
    # each rank in its node's pod, under the Trainer's pod name, with that pod's address
    assert {(host, address) for _, host, address in ranks} == {(p["name"], p["podIP"]) for p in pods}, (ranks, pods)
    assert {re.sub(r".*-train-0-node-0-", "", host) for _, host, _ in ranks} == {"0", "1"}, ranks
    assert all(ipaddress.ip_address(p["podIP"]) in POD_RANGE for p in pods)
    assert "strategy: deepspeed (strategy=deepspeed (ZeRO-2)" in log, log[-3000:]
    assert checkpoints.committed(out / "checkpoints")[-1].step == 4
    assert status["hostNodeName"] == pods[0]["hostNodeName"]  # node 0's pod runs the task's process, rank 0
    # rank 0 reported to the Trainer's status endpoint the executor served on the bridge (KEP-2779): the TrainJob's
    # status.trainerStatus, as `kubectl get trainjob -o jsonpath='{.status.trainerStatus}'` shows it on a cluster
    trainer_status = status["trainerStatus"]
    metrics = {m["name"]: m["value"] for m in trainer_status["metrics"]}
    assert trainer_status["progressPercentage"] == 100 and metrics["step"] == "4", trainer_status
    assert math.isfinite(float(metrics["loss"])) and "[trainer status]" not in log, trainer_status
    assert leftovers() == before, "every pod, address and bridge goes with the run"


@pytest.mark.drill
def test_a_trainjob_whose_node_is_lost_fails_and_the_retry_resumes_on_the_node_left_and_a_replacement(
    workdir, tmp_path, capsys
):
    """The TrainJob node-loss drill (`pytest -m drill`, not in `make test`). Node 1's node lost after the first
    commit: its pod is gone, so the TrainJob fails as the JobSet does (no failurePolicy: the first failed node Job
    fails it) and node 0's pod is deleted with it; Argo's retry creates a new TrainJob, whose pods go to the node left
    and a replacement, and resumes from that checkpoint."""
    before = leftovers()
    out = tmp_path / "train"
    steps, every = 8, 2
    lost: dict[str, object] = {}

    def lose_node_1(state: Path) -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not checkpoints.committed(out / "checkpoints"):
            time.sleep(0.05)
        (status_file,) = (state / "runs").glob("*/status.json")
        pods = json.loads(status_file.read_text())["status"]["nodes"]["train"]["pods"]
        victim = next(p for p in pods if p["name"].endswith("-node-0-1"))
        lose_node(pods, victim["hostNodeName"])
        lost["at"] = time.monotonic()
        lost.update(node=victim["hostNodeName"], done=checkpoints.committed(out / "checkpoints")[-1].step)
        while time.monotonic() < deadline and "failure" not in lost:  # the attempt's end, as the retry shows it
            message = json.loads(status_file.read_text())["status"]["nodes"]["train"].get("message", "")
            if "the TrainJob failed" in message:
                lost["failure"] = message
            time.sleep(0.05)

    argv = train_args(
        workdir, out, "deepspeed", launcher="torchrun", max_steps=steps, checkpoint_every=every, zero_stage=2,
        grad_accum_steps=8,
    )  # fmt: skip
    node, status, log = run_on_nodes(
        tmp_path / "state", argv, retries=1, during=lose_node_1, launcher="trainjob", backoff="3s"
    )
    assert node.phase == "Succeeded" and node.retries == 1, f"{node.message}\n{log[-3000:]}"
    failure = str(lost.get("failure", ""))
    assert (
        failure.startswith("the TrainJob failed: pod ") and f"-node-0-1 on {lost['node']}: its node was lost" in failure
    )
    resumed = [int(s) for s in re.findall(RESUMED, log)]
    assert resumed == [lost["done"]], log[-3000:]
    assert checkpoints.committed(out / "checkpoints")[-1].step == steps
    pods = status["pods"]  # the retry's: one on the node left, one on the replacement
    assert {p["hostNodeName"] for p in pods} == {"node-1", "node-2", "node-3"} - {str(lost["node"])}, pods
    assert leftovers() == before, "every pod, address and bridge goes with the run"
    with capsys.disabled():
        print(
            f"\nTrainJob node {lost['node']} lost after checkpoint step {lost['done']}: the retry resumed from step "
            f"{resumed[0]}; {time.monotonic() - float(str(lost['at'])):.0f} s from the loss to the end of training"
        )
