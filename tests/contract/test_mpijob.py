"""The MPIJob launcher (cluster.launcher: mpijob): strict against the MPI Operator's CRD (v0.8.0, vendored), wired
from the profile, within the retry budget, and followed by Argo through conditions that track the job's status."""

import re

import pytest

from eksflow import plan
from eksflow.errors import ConfigError
from eksflow.launchers import mpijob
from tests.argo_substitution import manifest_object
from tests.contract.test_cluster_rendering import VARIANTS, errors, render
from tests.flagship import config, pipeline

MPIJOB_VARIANTS = sorted(name for name in VARIANTS if "mpijob" in name)
# A Kubernetes label key (what Argo's label-selector parser accepts as a condition's key): [prefix/]name.
QUALIFIED_NAME = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
REQUIREMENT = re.compile(r"^\s*(?P<key>\S+?)\s*(?P<op>==|!=|=|>|<)\s*(?P<value>\S+)\s*$")


def job_of(name):
    workflow = render(VARIANTS[name])
    (train,) = [t for t in workflow["spec"]["templates"] if t["name"] == "train"]
    return train, manifest_object(train)


@pytest.mark.parametrize("name", MPIJOB_VARIANTS)
def test_every_mpijob_variant_validates_strictly(name, crd_validator):
    _, job = job_of(name)
    assert job["apiVersion"] == "kubeflow.org/v2beta1" and job["kind"] == "MPIJob"
    assert errors(crd_validator(job), job) == []


def test_a_misspelled_mpijob_field_is_rejected(crd_validator):
    _, job = job_of("gpu-mpijob")
    job["spec"]["slotsPerWorkers"] = job["spec"].pop("slotsPerWorker")
    assert any("slotsPerWorkers" in e for e in errors(crd_validator(job), job))


def launcher_and_worker(job):
    specs = job["spec"]["mpiReplicaSpecs"]
    return [specs[role]["template"]["spec"]["containers"][0] for role in ("Launcher", "Worker")]


def mpirun(launcher):
    """The launcher's mpirun command line, after eksflow's wrapper (eksflow.runtime.mpi_launcher) and its `--`."""
    command = launcher["command"]
    assert command[:3] == ["python", "-m", "eksflow.runtime.mpi_launcher"]
    return command[command.index("--") + 1 :]


def test_gpu_mpijob_runs_mpirun_over_a_worker_per_node_with_the_profiles_wiring():
    train, job = job_of("p4d-efa-spot-mpijob-volcano")
    spec = job["spec"]
    assert spec["slotsPerWorker"] == 8 and spec["mpiReplicaSpecs"]["Worker"]["replicas"] == 2  # 8 GPUs x 2 nodes
    launcher, worker = launcher_and_worker(job)
    command = mpirun(launcher)
    assert command[:3] == ["mpirun", "-np", "16"]
    forwarded = {command[i + 1] for i, item in enumerate(command) if item == "-x"}
    env = {e["name"]: e["value"] for e in launcher["env"]}
    assert set(env) | {"PATH", "LD_LIBRARY_PATH"} == forwarded  # every launcher variable reaches the ranks
    assert env["FI_PROVIDER"] == "efa" and env["NCCL_PROTO"] == "simple"
    name = "{{workflow.name}}-train-{{retries}}"
    assert env["MASTER_ADDR"] == f"{name}-worker-0.{name}"  # the operator's hostname + headless Service
    assert launcher["args"][:3] == ["python", "-m", "eksflow.llm.steps.train"] and "--launcher=mpi" in launcher["args"]
    assert "--num-workers=16" in launcher["args"] and "--use-gpu=true" in launcher["args"]
    assert "nvidia.com/gpu" not in launcher["resources"]["limits"]  # mpirun needs no device
    assert worker["command"] == mpijob.SSHD and "args" not in worker
    limits = worker["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == "8" and limits["vpc.amazonaws.com/efa"] == "4"
    assert spec["sshAuthMountPath"] == "/home/eksflow/.ssh"
    worker_pod = spec["mpiReplicaSpecs"]["Worker"]["template"]["spec"]
    assert worker_pod["nodeSelector"]["topology.kubernetes.io/zone"] == "us-west-2a"
    assert worker_pod["nodeSelector"]["karpenter.sh/capacity-type"] == "spot"
    assert "schedulerName" not in worker_pod  # the operator sets it when it gang-schedules
    policy = spec["runPolicy"]
    assert policy["schedulingPolicy"] == {"minAvailable": 3, "queue": "eksflow"}  # launcher + 2 workers at once
    assert policy["cleanPodPolicy"] == "Running" and "suspend" not in policy
    assert train["resource"]["setOwnerReference"] is True


def test_kueue_admits_the_mpijob_whole_and_cpu_gets_one_pod_of_ranks():
    _, job = job_of("gpu-mpijob")
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "eksflow"
    assert job["spec"]["runPolicy"]["suspend"] is True and "schedulingPolicy" not in job["spec"]["runPolicy"]
    _, cpu = job_of("cpu-mpijob")
    launcher, _ = launcher_and_worker(cpu)
    assert cpu["spec"]["slotsPerWorker"] == 2 and cpu["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] == 1
    assert mpirun(launcher)[:3] == ["mpirun", "-np", "2"] and "LD_LIBRARY_PATH" not in launcher["command"]
    assert "--strategy=deepspeed" in launcher["args"] and "--zero-stage=3" in launcher["args"]


def test_several_cpu_nodes_get_a_worker_pod_each_with_one_rank_and_gloo_on_the_pods_eth0():
    _, job = job_of("cpu-mpijob-2-nodes")
    launcher, _ = launcher_and_worker(job)
    assert job["spec"]["slotsPerWorker"] == 1 and job["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] == 2
    assert mpirun(launcher)[:3] == ["mpirun", "-np", "2"] and "--num-workers=2" in launcher["args"]
    env = {e["name"]: e["value"] for e in launcher["env"]}
    assert env["GLOO_SOCKET_IFNAME"] == "eth0"
    forwarded = [launcher["command"][i + 1] for i, word in enumerate(launcher["command"]) if word == "-x"]
    assert "GLOO_SOCKET_IFNAME" in forwarded  # to the ranks, which sshd starts without the container's environment
    assert env["MASTER_ADDR"] == f"{job['metadata']['name']}-worker-0.{job['metadata']['name']}"


def test_the_launcher_fails_unless_the_steps_every_output_is_in_its_outputs_folder():
    """Open MPI 5's mpirun can exit 0 after losing a worker's daemon: the wrapper checks the train step's outputs
    (each one the collector publishes) in the folder the ranks write them to, the step's own --outputs-dir."""
    _, job = job_of("gpu-mpijob")
    launcher, _ = launcher_and_worker(job)
    wrapper = launcher["command"][: launcher["command"].index("--")]
    folder = "/fsx/runs/{{workflow.name}}/train/outputs"
    assert f"--outputs-dir={folder}" in wrapper and f"--outputs-dir={folder}" in launcher["args"]
    expected = {word.removeprefix("--expect=") for word in wrapper if word.startswith("--expect=")}
    workflow = render(VARIANTS["gpu-mpijob"])
    (collector,) = [t for t in workflow["spec"]["templates"] if t["name"] == "train-outputs"]
    assert expected == {p["name"] for p in collector["outputs"]["parameters"]} and "final_loss" in expected


def attempts(overrides):
    (job,) = pipeline(overrides).jobs
    return job.attempts(config(overrides))


def test_the_retry_layers_stay_within_the_budget():
    _, job = job_of("gpu-mpijob")
    assert job["spec"]["runPolicy"]["backoffLimit"] == 1
    # Argo (1 retry) x launcher Job (3 retries); Ray Train takes no part
    assert attempts([*VARIANTS["gpu-mpijob"], "cluster.backoff_limit=3"]) == 2 * 4
    assert attempts(VARIANTS["cpu-mpijob"]) == 2 * 2


def test_trainium_cannot_use_the_mpijob_launcher():
    with pytest.raises(ConfigError, match=r"cluster\.launcher: mpijob runs on GPU or CPU nodes.*cluster\.launcher="):
        plan.check(pipeline(["cluster.instance_type=trn1.32xlarge", "cluster.launcher=mpijob"]))


def selector(expression):
    """Argo's successCondition/failureCondition: comma-separated label-selector requirements over JSON paths."""
    requirements = []
    for part in expression.split(","):
        match = REQUIREMENT.match(part)
        assert match, f"not a label-selector requirement: {part!r}"
        assert QUALIFIED_NAME.match(match["key"]), f"Argo's parser refuses the key {match['key']!r}"
        requirements.append((match["key"], match["op"], match["value"]))
    return requirements


def holds(requirement, obj):
    """One requirement on `obj`, as Argo evaluates it (gjson path; `>`/`<` compare integers; absent: no match)."""
    key, op, value = requirement
    found = obj
    for part in key.split("."):
        if not isinstance(found, dict) or part not in found:
            return op == "!="
        found = found[part]
    if op in (">", "<"):
        return int(found) > int(value) if op == ">" else int(found) < int(value)
    return (str(found) == value) == (op in ("=", "=="))


def condition(kind, status="True", reason=""):
    return {"type": kind, "status": status, "reason": reason or f"MPIJob{kind}", "message": kind}


# Statuses the MPI Operator v0.8.0 writes (pkg/controller/mpi_job_controller.go, updateMPIJobStatus), backoffLimit 1.
STATUSES = {
    "created": {"conditions": [condition("Created")]},
    "running": {
        "conditions": [condition("Created"), condition("Running")],
        "replicaStatuses": {"Launcher": {"active": 1}, "Worker": {"active": 1}},
    },
    "launcher-retrying": {  # the launcher Job's first pod failed; its backoffLimit allows one more
        "conditions": [condition("Created"), condition("Running")],
        "replicaStatuses": {"Launcher": {"failed": 1, "active": 1}, "Worker": {"active": 1}},
    },
    "succeeded": {
        "conditions": [condition("Created"), condition("Running", "False"), condition("Succeeded")],
        "replicaStatuses": {"Launcher": {"succeeded": 1}, "Worker": {}},
    },
    "backoff-exhausted": {
        "conditions": [
            condition("Created"),
            condition("Running", "False"),
            condition("Failed", reason="BackoffLimitExceeded"),
        ],
        "replicaStatuses": {"Launcher": {"failed": 2}, "Worker": {"active": 1}},
    },
    "worker-evicted": {
        "conditions": [
            condition("Created"),
            condition("Running", "False"),
            condition("Failed", reason="MPIJobEvicted"),
        ],
        "replicaStatuses": {"Launcher": {"active": 1}, "Worker": {"failed": 1}},
    },
}


@pytest.mark.parametrize("state", sorted(STATUSES))
def test_the_resource_templates_conditions_follow_the_mpijob_status(state, crd_validator):
    train, job = job_of("gpu-mpijob")
    status = STATUSES[state]
    observed = {**job, "status": status}
    assert errors(crd_validator(observed), observed) == []  # a status the CRD admits
    succeeded = all(holds(r, observed) for r in selector(train["resource"]["successCondition"]))
    failed = any(holds(r, observed) for r in selector(train["resource"]["failureCondition"]))
    by_type = {c["type"]: c["status"] == "True" for c in status["conditions"]}
    assert succeeded == by_type.get("Succeeded", False)
    assert failed == by_type.get("Failed", False)
