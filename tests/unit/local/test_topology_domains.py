"""Kueue's topology placement on simulated nodes (topology_domains.py): one domain of the level a job requires, the
smallest that holds its pods, or Pending with one line; a preferred level never keeps a job Pending."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import yaml

from eksflow import topology
from eksflow.local.node import Requests
from eksflow.local.pod_network import unavailable
from eksflow.local.resources import describe
from eksflow.local.sim_nodes import SimNode, choose_node, new_node
from eksflow.local.substitution import PLACEHOLDER
from eksflow.local.topology_domains import (
    LEVEL_NAMES,
    Placement,
    TopologyAsk,
    place,
    topology_ask,
)
from eksflow.manifests import REFERENCE
from eksflow.profiles import HOSTNAME_LABEL, NETWORK_LAYER_LABEL
from eksflow.profiles import PREFERRED_TOPOLOGY_ANNOTATION as PREFERRED_ANNOTATION
from eksflow.profiles import REQUIRED_TOPOLOGY_ANNOTATION as REQUIRED_ANNOTATION
from tests.unit.local.test_resources import rendered, resource, run, workflow
from tests.unit.local.test_trainjob_handler import trainjob

RACK = NETWORK_LAYER_LABEL.format(3)
CORE = Requests(1000, 2**30)


def racks(*sizes: int) -> list[SimNode]:
    """Nodes in racks nn-rack-a, nn-rack-b, ... of the given sizes, all in one block."""
    nodes = []
    for rack, size in zip("abcdef", sizes, strict=False):
        for _ in range(size):
            node = new_node(f"node-{len(nodes) + 1}", CORE)
            node.labels[RACK] = f"nn-rack-{rack}"
            nodes.append(node)
    return nodes


def test_the_simulated_nodes_carry_eks_topology_labels_and_the_renderers_annotations_mean_them():
    node = new_node("node-3", CORE)
    assert node.labels == {
        NETWORK_LAYER_LABEL.format(1): "nn-spine-1",
        NETWORK_LAYER_LABEL.format(2): "nn-block-1",
        NETWORK_LAYER_LABEL.format(3): "nn-rack-1",
        HOSTNAME_LABEL: "node-3",
    }
    # what eksflow.topology renders is what the simulated nodes and the placement read
    assert set(topology.LEVELS) == set(LEVEL_NAMES) and set(topology.NODE_LABELS.values()) <= set(node.labels)
    assert {LEVEL_NAMES[label]: label for label in topology.NODE_LABELS.values()} == topology.NODE_LABELS
    assert (topology.ANNOTATIONS["required"], topology.ANNOTATIONS["preferred"]) == (
        REQUIRED_ANNOTATION,
        PREFERRED_ANNOTATION,
    )
    assert topology_ask([(REQUIRED_ANNOTATION, RACK), ("other", "x")]) == TopologyAsk(required=RACK)


def test_a_required_level_takes_the_smallest_domain_that_holds_every_pod():
    nodes = racks(3, 2)
    assert place(nodes, 2, TopologyAsk(required=RACK), "job") == Placement((RACK, "nn-rack-b"))
    assert place(nodes, 3, TopologyAsk(required=RACK), "job") == Placement((RACK, "nn-rack-a"))
    assert place(nodes, 3, TopologyAsk(), "job") == Placement(None)  # no topology: any node
    # the pods of a job confined to a domain go to its nodes alone, spread over them
    chosen = []
    for i in range(4):
        node = choose_node(nodes, "job", CORE, (RACK, "nn-rack-b"))
        node.pods[f"job-{i}"] = "job"
        chosen.append(node.name)
    assert chosen == ["node-4", "node-5", "node-4", "node-5"]


def test_a_required_level_no_domain_holds_is_pending_with_each_domains_node_count():
    nodes = racks(3, 2)
    nodes[0].lost = True  # a lost node, and one being drained, take no pod
    nodes[4].cordoned = True
    placement = place(nodes, 3, TopologyAsk(required=RACK), "TrainJob x-train")
    assert placement == Placement(
        None,
        "Pending: TrainJob x-train's 3 pods require one rack (topology.k8s.aws/network-node-layer-3) with a node for "
        "each, and none has 3: nn-rack-a 2 nodes, nn-rack-b 1 node",
    )
    two_hosts = place(racks(2), 2, TopologyAsk(required=HOSTNAME_LABEL), "job").pending
    assert two_hosts.endswith("none has 2: node-1 1 node, node-2 1 node")


def test_a_preferred_level_keeps_the_pods_together_when_it_can_and_is_never_pending():
    nodes = racks(3, 2)
    assert place(nodes, 2, TopologyAsk(preferred=RACK), "job").domain == (RACK, "nn-rack-b")
    assert place(nodes, 4, TopologyAsk(preferred=RACK), "job") == Placement(None)


needs_root = pytest.mark.skipif(bool(unavailable()), reason=unavailable() or "")


@needs_root
def test_a_trainjob_no_domain_holds_stays_pending_saying_why_until_its_deadline(tmp_path: Path) -> None:
    """Two pods requiring one host of two simulated nodes: Pending (the task's phase and message), nothing started."""
    manifest = yaml.safe_load(trainjob(["python", "-c", "raise SystemExit(1)"]))
    pod_template = manifest["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
    pod_template["template"]["spec"]["template"]["metadata"]["annotations"] = {REQUIRED_ANNOTATION: HOSTNAME_LABEL}
    manifest["spec"]["activeDeadlineSeconds"] = 3
    seen: list[str] = []

    def watch() -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not seen:
            for status in (tmp_path / "state" / "runs").glob("*/status.json"):
                train = json.loads(status.read_text())["status"]["nodes"].get("train", {})
                if train.get("phase") == "Pending" and train.get("message", "").startswith("Pending: TrainJob"):
                    seen.append(train["message"])
            time.sleep(0.1)

    threading.Thread(target=watch, daemon=True).start()
    result = run(workflow([("train", None)], [resource("train", yaml.safe_dump(manifest))]), tmp_path, nodes=2)
    train = result.nodes["train"]
    assert train.phase == "Failed" and seen, train.message
    assert (
        train.message.startswith("Pending: TrainJob ") and "require one host (kubernetes.io/hostname)" in train.message
    )
    assert train.message.endswith("none has 2: node-1 1 node, node-2 1 node; exceeded activeDeadlineSeconds=3")
    assert not (result.run_dir / "tasks" / "train" / "pods").exists()  # no pod started


@pytest.mark.parametrize("launcher", ["rayjob", "mpijob", "trainjob"])
def test_every_topology_aware_job_tells_the_executor_the_level_its_training_pods_require(launcher: str) -> None:
    parsed = rendered(f"cluster.launcher={launcher}", "cluster.nodes=2", "cluster.topology=rack")
    (template,) = [t for t in parsed["spec"]["templates"] if t["name"] == "train"]
    job = describe(REFERENCE.sub(PLACEHOLDER, template["resource"]["manifest"]), "train")
    assert topology_ask(job.pod_annotations) == TopologyAsk(required=RACK)
