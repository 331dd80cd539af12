"""`cluster.topology`: Kueue's podset topology annotation on every training pod of the RayJob, MPIJob and TrainJob,
and the Kueue Topology and ResourceFlavor behind it, strict against Kueue's CRDs (vendored)."""

from pathlib import Path

import pytest
import yaml

from eksflow import topology
from tests.contract.test_cluster_rendering import VARIANTS, embedded, errors, render, trainjob_pod
from tests.flagship import config

ROOT = Path(__file__).resolve().parents[2]
GITOPS_OVERRIDES = ["cluster.instance_type=p5.48xlarge"]  # the Makefile's `python -m pipelines.topology --set ...`


def pod_templates(job):
    """Every pod template of a training job: a RayJob's head and workers, an MPIJob's launcher and workers, ..."""
    spec = job["spec"]
    if job["kind"] == "RayJob":
        cluster = spec["rayClusterSpec"]
        return [group["template"] for group in [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]]
    if job["kind"] == "MPIJob":
        return [replica["template"] for replica in spec["mpiReplicaSpecs"].values()]
    assert job["kind"] == "TrainJob"
    return [trainjob_pod(job)]


def training_job(overrides):
    (job,) = [obj for name, obj in embedded(render(overrides)) if name == "train"]
    return job


@pytest.mark.parametrize(("launcher", "pods"), [("rayjob", 2), ("mpijob", 2), ("trainjob", 1)])
def test_a_rack_topology_is_on_every_training_pod_of_each_launcher(launcher, pods):
    job = training_job(["cluster.instance_type=g5.12xlarge", f"cluster.launcher={launcher}", "cluster.topology=rack"])
    templates = pod_templates(job)
    assert len(templates) == pods
    for template in templates:
        annotations = template["metadata"]["annotations"]
        assert annotations["kueue.x-k8s.io/podset-required-topology"] == "topology.k8s.aws/network-node-layer-3"
        assert "kueue.x-k8s.io/podset-preferred-topology" not in annotations


@pytest.mark.parametrize(
    ("variant", "annotation", "label"),
    [
        ("gpu-rayjob-block-preferred", "preferred", "topology.k8s.aws/network-node-layer-2"),
        ("gpu-mpijob-host", "required", "kubernetes.io/hostname"),
        ("gpu-kueue", None, None),  # cluster.topology: none
    ],
)
def test_each_topology_and_mode_is_the_annotation_kueue_reads(variant, annotation, label):
    for template in pod_templates(training_job(VARIANTS[variant])):
        placed = {k: v for k, v in template["metadata"]["annotations"].items() if k.endswith("-topology")}
        assert placed == ({f"kueue.x-k8s.io/podset-{annotation}-topology": label} if annotation else {})


def test_the_topology_and_its_resource_flavor_validate_strictly_and_hold_every_level(kueue_validator):
    network, flavor = topology.objects(config(GITOPS_OVERRIDES))
    for obj in (network, flavor):
        assert errors(kueue_validator(obj), obj) == [], obj["kind"]
    levels = [level["nodeLabel"] for level in network["spec"]["levels"]]
    assert set(topology.NODE_LABELS.values()) <= set(levels) and levels[-1] == "kubernetes.io/hostname"
    assert flavor["spec"]["topologyName"] == network["metadata"]["name"]
    assert flavor["spec"]["nodeLabels"] == {"node.kubernetes.io/instance-type": "p5.48xlarge"}  # the training nodes
    network["spec"]["level"] = network["spec"].pop("levels")
    assert errors(kueue_validator(network), network)  # strict: a misspelled field is refused


def test_committed_topology_objects_match_a_fresh_render():
    committed = ROOT / "workflow-templates" / "topology.yaml"
    assert committed.is_file(), "run `make templates` and commit workflow-templates/"
    assert list(yaml.safe_load_all(committed.read_text())) == topology.objects(config(GITOPS_OVERRIDES)), (
        "workflow-templates/topology.yaml is stale: run `make templates`"
    )
