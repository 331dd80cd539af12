"""`plan` lists the pods a pipeline leaves running (the serving fleet) beside training, priced per hour.

What it reads is what Argo gets: the Deployments and StatefulSets the pipeline's resource tasks apply, their
replicas, requests and devices, and the instance type their node selector or node affinity pins.
"""

from typing import Any

import pytest

from eksflow import Pipeline, PipelineConfig, plan, profiles, resource
from eksflow.cli import apply_variant
from eksflow.errors import ConfigError
from pipelines.llama_lora import build
from tests.commands import python
from tests.flagship import config

TABLE = plan.prices()
USD = TABLE["usd_per_hour"]
DATED = f"(on-demand, {TABLE['region']}, prices as of {TABLE['as_of']})"
LEFT_RUNNING = "(Deployment, left running after the workflow)"
PER_HOUR = "it serves after the workflow ends: a cost per hour, not per run"
PROXY_ROWS = {
    "proxy: pods": f"2 {LEFT_RUNNING}",
    "proxy: requests per pod": "cpu 1, memory 2Gi",
    "proxy: devices per pod": "none",
    "proxy: instance": "not pinned (no node.kubernetes.io/instance-type, nor Karpenter's instance-family and "
    "instance-size, in its node selector or node affinity): the cluster picks",
    "proxy: cost per hour": "unknown: no instance type to price",
}


def fleet_rows(rows: list[tuple[str, str]]) -> dict[str, str]:
    return {name: value for name, value in rows if name.split(":")[0] in ("vllm", "proxy", "serving")}


def flagship_plan(overrides: list[str], variant: str | None = None) -> list[tuple[str, str]]:
    return plan.check(build(apply_variant(config(overrides), variant))).rows


def test_the_default_plan_lists_the_cpu_fleet_and_its_cost_per_hour():
    rows = flagship_plan([])
    assert fleet_rows(rows) == {
        "vllm: pods": f"2 {LEFT_RUNNING}",
        "vllm: requests per pod": "cpu 14, memory 48Gi",
        "vllm: devices per pod": "none",
        "vllm: instance": "m6i.4xlarge x 2 (1 pod per node), on-demand",
        "vllm: cost per hour": f"${2 * USD['m6i.4xlarge']:,.2f} {DATED}",
        **PROXY_ROWS,
        "serving: cost per hour": f"${2 * USD['m6i.4xlarge']:,.2f} plus proxy: unknown; {PER_HOUR}",
    }
    names = [name for name, _ in rows]
    assert names.index("train: cost per run") < names.index("vllm: pods")  # beside training, after it


@pytest.mark.parametrize(
    ("overrides", "replicas", "devices", "requests", "instance_type"),
    [
        (
            ["serving.instance_type=g5.12xlarge", "serving.replicas=3"],
            3,
            "4 GPUs",
            "cpu 44, memory 172Gi",
            "g5.12xlarge",
        ),
        (["serving.instance_type=g6.xlarge"], 2, "1 GPU", "cpu 0, memory 14Gi", "g6.xlarge"),
        (
            ["serving.instance_type=p4d.24xlarge", "serving.replicas=4"],
            4,
            "8 GPUs",
            "cpu 92, memory 1036Gi",
            "p4d.24xlarge",
        ),
    ],
    ids=["g5-4-gpus-3-replicas", "g6-inference-only", "p4d-8-gpus"],
)
def test_a_gpu_fleet_shows_its_gpus_instances_and_cost_per_hour(overrides, replicas, devices, requests, instance_type):
    hourly = replicas * USD[instance_type]
    assert fleet_rows(flagship_plan(overrides, variant="gpu")) == {
        "vllm: pods": f"{replicas} {LEFT_RUNNING}",
        "vllm: requests per pod": requests,
        "vllm: devices per pod": devices,
        "vllm: instance": f"{instance_type} x {replicas} (1 pod per node), on-demand",
        "vllm: cost per hour": f"${hourly:,.2f} {DATED}",
        **PROXY_ROWS,
        "serving: cost per hour": f"${hourly:,.2f} plus proxy: unknown; {PER_HOUR}",
    }


def test_every_node_eksflow_knows_has_a_price():
    assert sorted(set(profiles.NODES) - set(USD)) == []


def deployment(pod: dict[str, Any], replicas: Any = 2, kind: str = "Deployment") -> dict[str, Any]:
    labels = {"app": "web"}
    return {
        "apiVersion": "apps/v1",
        "kind": kind,
        "metadata": {"name": "web"},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": pod},
        },
    }


def container(requests: dict[str, str], limits: dict[str, str] | None = None) -> dict[str, Any]:
    return {"name": "app", "image": "app:1", "resources": {"requests": requests, "limits": limits or requests}}


def affinity(*terms: list[dict[str, Any]]) -> dict[str, Any]:
    """A required node affinity: each term a list of matchExpressions."""
    required = {"nodeSelectorTerms": [{"matchExpressions": term} for term in terms]}
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}}


def own_plan(obj: dict[str, Any], *, owned: bool = False) -> dict[str, str]:
    """The rows of a user's own pipeline applying `obj` (no training, no LLM layer)."""
    with Pipeline(PipelineConfig(name="own"), title="own", parameters={"replicas": "3"}) as p:
        resource("web", obj, action="apply", owned=owned)
    return dict(plan.check(p).rows)


def test_karpenter_family_and_size_pin_the_instance_and_small_pods_share_a_node():
    pod = {
        "nodeSelector": {"karpenter.k8s.aws/instance-family": "m6i", "karpenter.k8s.aws/instance-size": "4xlarge"},
        "containers": [container({"cpu": "3", "memory": "4Gi"})],
    }
    rows = own_plan(deployment(pod, replicas=10, kind="StatefulSet"))
    assert rows["web: pods"] == "10 (StatefulSet, left running after the workflow)"
    assert rows["web: instance"] == "m6i.4xlarge x 2 (5 pods per node), any capacity type"  # 16 vCPUs / 3
    assert rows["web: cost per hour"] == f"${2 * USD['m6i.4xlarge']:,.2f} {DATED}"


def test_node_affinity_naming_several_instance_types_gives_a_cost_range():
    term = [
        {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["g5.xlarge", "g6.xlarge"]},
        {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["spot"]},
    ]
    pod = {"affinity": affinity(term), "containers": [container({"cpu": "2", "memory": "8Gi", "nvidia.com/gpu": "1"})]}
    rows = own_plan(deployment(pod))
    assert rows["web: devices per pod"] == "1 GPU"
    assert rows["web: instance"] == "g5.xlarge x 2 (1 pod per node) or g6.xlarge x 2 (1 pod per node), spot"
    low, high = sorted(2 * USD[t] for t in ("g5.xlarge", "g6.xlarge"))
    assert rows["web: cost per hour"] == f"${low:,.2f} to ${high:,.2f} {DATED}"


@pytest.mark.parametrize(
    ("pod", "instance", "why"),
    [
        ({}, "not pinned (no node.kubernetes.io/instance-type,", "unknown: no instance type to price"),
        (
            {"nodeSelector": {"node.kubernetes.io/instance-type": "x9.mega"}},
            "x9.mega, any capacity type",
            "unknown: eksflow has no shape or price for x9.mega",
        ),
        (
            # one term pins a type, the other does not: the pod may land anywhere
            {
                "affinity": affinity(
                    [{"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["g5.xlarge"]}],
                    [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["us-east-1a"]}],
                )
            },
            "not pinned (no node.kubernetes.io/instance-type,",
            "unknown: no instance type to price",
        ),
    ],
    ids=["no-selector", "unknown-type", "one-term-unpinned"],
)
def test_an_instance_type_that_cannot_be_derived_shows_the_requests_and_an_unknown_cost(pod, instance, why):
    rows = own_plan(deployment({**pod, "containers": [container({"cpu": "500m", "memory": "1Gi"})]}))
    assert rows["web: requests per pod"] == "cpu 500m, memory 1Gi"
    assert rows["web: instance"].startswith(instance)
    assert rows["web: cost per hour"] == why
    assert rows["serving: cost per hour"] == f"web: unknown; {PER_HOUR}"


def test_replicas_set_at_run_time_and_an_owned_deployment_are_said_so():
    pod = {"nodeSelector": {"node.kubernetes.io/instance-type": "m6i.4xlarge"}, "containers": [container({"cpu": "1"})]}
    with Pipeline(PipelineConfig(name="own"), title="own", parameters={"replicas": "3"}) as p:
        resource("web", deployment(pod, replicas=p.parameters.replicas), action="apply")
    rows = dict(plan.check(p).rows)
    assert rows["web: pods"] == "set at run time (Deployment, deleted with the workflow)"
    assert rows["web: cost per hour"] == "unknown: the replicas are set at run time"
    assert rows["serving: cost per hour"].endswith("it serves while the workflow runs: a cost per hour, not per run")


def test_a_pod_no_pinned_node_can_hold_is_refused_in_one_line():
    pod = {
        "nodeSelector": {"node.kubernetes.io/instance-type": "g5.xlarge"},
        "containers": [container({"cpu": "2", "memory": "8Gi", "nvidia.com/gpu": "2"})],
    }
    with pytest.raises(ConfigError) as err:
        own_plan(deployment(pod))
    (line,) = str(err.value).splitlines()
    assert line == (
        "web: a pod requests cpu 2, memory 8Gi and devices: 2 GPUs, more than one g5.xlarge node has; fix: lower its "
        "requests or pin a larger instance type"
    )


def test_a_quantity_kubernetes_would_refuse_is_one_line():
    pod = {"containers": [container({"cpu": "lots"})]}
    with pytest.raises(ConfigError) as err:
        own_plan(deployment(pod))
    (line,) = str(err.value).splitlines()
    assert line.startswith("web: cpu quantity 'lots' is not a Kubernetes quantity") and "fix the Deployment's" in line


def test_training_jobs_and_objects_without_pods_are_not_serving_rows():
    rows = dict(flagship_plan(["cluster.instance_type=g5.12xlarge"]))  # the RayJob is a resource task too
    assert not any(name.startswith(("vllm-service", "proxy-config", "proxy-pdb", "vllm-policy")) for name in rows)
    assert "train: cost per hour" in rows and "train: pods" in rows and "train-rayjob: pods" not in rows


def test_the_plan_command_prints_the_fleet_beside_training(monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")  # one table line per row
    done = python("pipelines/llama_lora.py", "plan", "--variant", "gpu", "--set", "serving.instance_type=g5.xlarge")
    assert done.returncode == 0, done.stderr
    lines = [" ".join(line.replace("│", " ").split()) for line in done.stdout.splitlines()]
    assert f"vllm: cost per hour ${2 * USD['g5.xlarge']:,.2f} {DATED}" in lines
    assert "vllm: devices per pod 1 GPU" in lines and "proxy: cost per hour unknown: no instance type to price" in lines
