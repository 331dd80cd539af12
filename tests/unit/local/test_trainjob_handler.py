"""A TrainJob runs here as the Kubeflow Trainer runs it: a pod per node with the torch plugin's PET_* (trainjob.py,
train_pods.py). Without simulated nodes each pod is a process on this host; the pods here run a small program that
records what it was given, where the flagship's run torchrun (tests/e2e/test_nodes.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from eksflow.local import LocalExecutorError
from eksflow.local.node import Requests, pod_requests
from eksflow.local.resources import ResourceError, describe, nvidia_gpus, refusal
from eksflow.local.substitution import PLACEHOLDER
from eksflow.local.trainjob import procs_per_node
from eksflow.manifests import REFERENCE
from tests.unit.local.test_resources import phases, rendered, resource, run, workflow

GIB = 2**30
# Each pod writes the torch plugin's variables it got into argv[1]/<node rank>, then exits with its code in argv[2].
POD_REPORT = """
import json, os, pathlib, sys
out = pathlib.Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
rank = os.environ["PET_NODE_RANK"]
keys = ("PET_NNODES", "PET_NPROC_PER_NODE", "PET_MASTER_ADDR", "PET_MASTER_PORT", "FROM_TRAINER", "FROM_PATCH")
(out / rank).write_text(json.dumps({k: os.environ.get(k) for k in keys}))
sys.exit(int(json.loads(sys.argv[2])[int(rank)]))
"""


def trainjob(command: list[str], *, nodes: int = 2, runtime: str = "torch-distributed", **trainer: Any) -> str:
    """A TrainJob shaped like eksflow.launchers.trainjob renders it: the FSx claim and a topology through the patch."""
    pod_template = {
        "metadata": {
            "annotations": {"kueue.x-k8s.io/podset-required-topology": "topology.k8s.aws/network-node-layer-3"}
        },
        "spec": {
            "volumes": [{"name": "fsx", "persistentVolumeClaim": {"claimName": "fsx-claim"}}],
            "nodeSelector": {"node.kubernetes.io/instance-type": "m6i.4xlarge"},
            "containers": [
                {
                    "name": "node",
                    "volumeMounts": [{"name": "fsx", "mountPath": "/fsx"}],
                    "env": [{"name": "FROM_PATCH", "value": "patch"}],
                }
            ],
        },
    }
    manifest = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "{{workflow.name}}-train"},
        "spec": {
            "runtimeRef": {"name": runtime, "kind": "ClusterTrainingRuntime"},
            "trainer": {
                "image": "ghcr.io/eksflow/train-gpu:0.1.0",
                "command": command,
                "env": [{"name": "FROM_TRAINER", "value": "trainer"}],
                "numNodes": nodes,
                "numProcPerNode": 1,
                "resourcesPerNode": {"requests": {"cpu": "100m", "memory": "64Mi"}},
                **trainer,
            },
            "suspend": True,
            "runtimePatches": [
                {
                    "manager": "eksflow.dev/launcher",
                    "trainingRuntimeSpec": {
                        "template": {
                            "spec": {
                                "replicatedJobs": [{"name": "node", "template": {"spec": {"template": pod_template}}}]
                            }
                        }
                    },
                }
            ],
        },
    }
    return yaml.safe_dump(manifest, sort_keys=False)


def test_the_rendered_trainjob_is_torchrun_of_the_step_in_a_pod_per_node_with_fsx_and_its_topology():
    parsed = rendered("cluster.launcher=trainjob", "cluster.nodes=2", "cluster.topology=rack")
    (template,) = [t for t in parsed["spec"]["templates"] if t["name"] == "train"]
    job = describe(REFERENCE.sub(PLACEHOLDER, template["resource"]["manifest"]), "train")
    assert job.kind == "TrainJob" and refusal(job) == ""
    assert job.argv[:3] == ("torchrun", "-m", "eksflow.llm.steps.train") and "--launcher=torchrun" in job.argv
    assert job.train is not None and (job.train.nodes, job.train.procs_per_node) == (2, "1")
    assert job.train.requests == Requests(14000, 48 * GIB)
    assert ("kueue.x-k8s.io/podset-required-topology", "topology.k8s.aws/network-node-layer-3") in job.pod_annotations
    assert [(m.mount_path, m.claim) for m in job.mounts] == [("/fsx", "fsx-claim")]  # /dev/shm is this machine's
    assert ("GLOO_SOCKET_IFNAME", "eth0") in job.env


@pytest.mark.skipif(nvidia_gpus()[0] >= 8, reason="this machine has the GPUs the rendered TrainJob asks for")
def test_gpus_this_machine_lacks_are_refused_in_one_line():
    parsed = rendered("cluster.launcher=trainjob", "cluster.instance_type=p4d.24xlarge", "cluster.nodes=2")
    (template,) = [t for t in parsed["spec"]["templates"] if t["name"] == "train"]
    job = describe(REFERENCE.sub(PLACEHOLDER, template["resource"]["manifest"]), "train")
    why = refusal(job)
    assert why.startswith("the TrainJob needs 16 NVIDIA GPUs (trainer: 2 pods x 8 nvidia.com/gpu), this machine has")
    assert "\n" not in why and why.endswith("or `submit` to a cluster")


def test_requests_count_every_node_pod():
    manifest = yaml.safe_load(trainjob(["true"], nodes=3))
    assert pod_requests(manifest) == Requests(300, 3 * 64 * 2**20)


def test_without_simulated_nodes_every_pod_is_a_process_here_meeting_node_0_at_a_local_port(tmp_path: Path):
    out = tmp_path / "pods"
    manifest = workflow(
        [("train", None)], [resource("train", trainjob(["python", "-c", POD_REPORT, str(out), "[0, 0]"]))]
    )
    result = run(manifest, tmp_path)
    assert phases(result) == {"train": "Succeeded"}, result.nodes["train"].message
    seen = {rank.name: json.loads(rank.read_text()) for rank in out.iterdir()}
    assert sorted(seen) == ["0", "1"]
    assert {json.dumps({**v, "PET_MASTER_PORT": ""}) for v in seen.values()} == {
        json.dumps({"PET_NNODES": "2", "PET_NPROC_PER_NODE": "1", "PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": "",
                    "FROM_TRAINER": "trainer", "FROM_PATCH": "patch"})
    }  # fmt: skip
    assert len({v["PET_MASTER_PORT"] for v in seen.values()}) == 1  # one rendezvous, node 0's


def test_a_pod_that_fails_fails_the_trainjob_naming_it(tmp_path: Path):
    out = tmp_path / "pods"
    manifest = workflow(
        [("train", None)], [resource("train", trainjob(["python", "-c", POD_REPORT, str(out), "[0, 3]"]))]
    )
    train = run(manifest, tmp_path).nodes["train"]
    assert train.phase == "Failed"
    assert (
        train.message.startswith("the TrainJob failed: pod ") and "-train-node-0-1: exit code 3 (see " in train.message
    )


def test_node_0_failing_fails_the_trainjob_and_deletes_the_other_pods_at_once(tmp_path: Path):
    """As the JobSet deletes the other pods when a node's Job fails: node 1 never gets to write its file."""
    late = tmp_path / "node-1-finished"
    program = (
        "import os, pathlib, sys, time\n"
        "if os.environ['PET_NODE_RANK'] == '0': sys.exit(3)\n"
        f"time.sleep(30); pathlib.Path({str(late)!r}).touch()\n"
    )
    train = run(workflow([("train", None)], [resource("train", trainjob(["python", "-c", program]))]), tmp_path)
    assert train.nodes["train"].phase == "Failed" and train.nodes["train"].message.startswith("exit code 3")
    assert not late.exists()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"runtime": "mpi-distributed"}, r"references the runtime 'mpi-distributed'; here a TrainJob runs only as"),
        ({"env": [{"name": "PET_NNODES", "value": "4"}]}, r"spec.trainer.env sets PET_NNODES: the Trainer's torch"),
        ({"numProcPerNode": "many"}, r"numProcPerNode must be a positive number, auto, cpu or gpu, got 'many'"),
    ],
    ids=["mpi-runtime", "reserved-env", "bad-procs"],
)
def test_what_cannot_run_here_is_refused_before_any_task_runs(tmp_path: Path, change: dict, message: str) -> None:
    runtime = change.pop("runtime", "torch-distributed")
    text = trainjob(["true"], runtime=runtime, **change)
    with pytest.raises(LocalExecutorError, match=message):
        run(workflow([("train", None)], [resource("train", text)]), tmp_path)
    assert not (tmp_path / "state").exists()


def test_an_initializer_is_cluster_only():
    manifest = yaml.safe_load(trainjob(["true"]))
    manifest["spec"]["initializer"] = {"model": {"storageUri": "hf://x"}}
    with pytest.raises(ResourceError, match=r"spec.initializer is not supported locally"):
        describe(yaml.safe_dump(manifest), "train")


@pytest.mark.parametrize(
    ("value", "resources", "expected"),
    [
        (None, {"limits": {"cpu": "4"}, "requests": {"cpu": "2"}}, "4"),  # auto: the CPU limit first
        ("auto", {"requests": {"cpu": "1500m"}}, "2"),  # a Quantity's Value() rounds up
        ("auto", {"limits": {"nvidia.com/gpu": 8}}, "auto"),  # torchrun counts the GPUs
        ("cpu", {}, "1"),
        ("gpu", {"requests": {"cpu": "4"}}, "gpu"),
        (2, {"requests": {"cpu": "16"}}, "2"),
    ],
)
def test_proc_per_node_is_the_torch_plugins(value: Any, resources: dict, expected: str) -> None:
    assert procs_per_node(value, resources, "numProcPerNode") == expected
