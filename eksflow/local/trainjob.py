"""A TrainJob (trainer.kubeflow.org/v1alpha1, Kubeflow Trainer v2.3.0) on this machine, as the Trainer runs it.

On a cluster the Trainer merges the TrainJob into its runtime (`spec.runtimeRef`; `spec.runtimePatches` patch the
runtime's replicated job `node`) and makes a JobSet: one Indexed Job of `numNodes` pods `<trainjob>-node-0-<i>`,
each running `spec.trainer`'s command and args with its env, and a headless Service `<trainjob>` giving each pod
the name `<trainjob>-node-0-<i>.<trainjob>`. For a torch runtime its torch plugin adds PET_NNODES (numNodes),
PET_NPROC_PER_NODE (numProcPerNode, its "auto" resolved from `resourcesPerNode`), PET_NODE_RANK (the pod's
completion index), PET_MASTER_ADDR (`<trainjob>-node-0-0.<trainjob>`) and PET_MASTER_PORT (29500), which torchrun
reads as its options. The same runs here (train_pods.py): one process per pod on this host, or one pod per simulated
node (`run --nodes N`) placed by the pod template's Kueue topology annotation (topology_domains.py).

Refused before anything runs, in one line: a runtime that is not one of the Trainer's torch runtimes (`torch-*`,
as v2.3.0 names them; the policy of another, MPI, JAX or torchtune, is the runtime's and unknown here), PET_
variables in `spec.trainer.env` (the Trainer's webhook refuses them too), initializers (they run on the cluster),
and (resources.refusal) GPUs this machine lacks. Cluster-only settings (suspend, managedBy, scheduling fields of
the patched pods) have nothing to act on here and are ignored.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from eksflow.local.node import QuantityError, container_requests, quantity

# resources.py reads every resource manifest the same way; its helpers are this package's own
from eksflow.local.resources import (
    NEURON_RESOURCES,
    DeviceRequest,
    LocalJob,
    ResourceError,
    TrainLayout,
    _fields,
    _mounts,
    template_annotations,
)
from eksflow.profiles import GPU_RESOURCE

TRAINJOB_API = "trainer.kubeflow.org/v1alpha1"
TRAINER_JOB = "node"  # the torch runtimes' replicated job and container of the trainer (the Trainer's constants.Node)
MASTER_PORT = 29500  # the Trainer's constants.ContainerTrainerPort: PET_MASTER_PORT
TORCH_RUNTIME_PREFIX = "torch-"  # torch-distributed, torch-distributed-with-cache, ...: the torch plugin's runtimes
PET_PREFIX = "PET_"

_SPEC_USED = frozenset({"runtimeRef", "trainer", "runtimePatches", "activeDeadlineSeconds"})
_SPEC_CLUSTER_ONLY = frozenset({"suspend", "managedBy"})
_TRAINER_USED = frozenset({"image", "command", "args", "env", "numNodes", "numProcPerNode", "resourcesPerNode"})
_POD_USED = frozenset({"volumes", "containers"})
_POD_CLUSTER_ONLY = frozenset({
    "affinity", "imagePullSecrets", "nodeSelector", "schedulingGates", "securityContext", "serviceAccountName",
    "terminationGracePeriodSeconds", "tolerations",
})  # fmt: skip


def describe(manifest: Mapping[str, Any], where: str) -> LocalJob:
    """What a TrainJob does here: the trainer's argv in one pod per node; ResourceError for a bad one."""
    spec = _fields.mapping(manifest.get("spec"), f"{where}.spec")
    _fields.check_keys(spec, f"{where}.spec", _SPEC_USED, _SPEC_CLUSTER_ONLY)
    runtime = _fields.mapping(spec.get("runtimeRef"), f"{where}.spec.runtimeRef")
    name = _fields.text(runtime.get("name", ""), f"{where}.spec.runtimeRef.name")
    t_at = f"{where}.spec.trainer"
    trainer = _fields.mapping(spec.get("trainer"), t_at)
    _fields.check_keys(trainer, t_at, _TRAINER_USED)
    argv = tuple(
        _fields.text(item, f"{t_at}.{key}[{i}]")
        for key in ("command", "args")
        for i, item in enumerate(trainer.get(key) or [])
    )
    if not argv:
        raise ResourceError(f"{t_at}.command is empty; the runtime's own command does not run here, give torchrun's")
    env = _fields.env(trainer, t_at)
    reserved = sorted(n for n, _ in env if n.startswith(PET_PREFIX))
    if reserved:
        raise ResourceError(
            f"{t_at}.env sets {', '.join(reserved)}: the Trainer's torch plugin sets PET_*; remove them"
        )
    nodes = int(_fields.number(trainer.get("numNodes", 1), f"{t_at}.numNodes"))
    if nodes < 1:
        raise ResourceError(f"{t_at}.numNodes must be at least 1, got {nodes}")
    resources = _fields.mapping(trainer.get("resourcesPerNode"), f"{t_at}.resourcesPerNode")
    try:
        requests = container_requests(resources)
    except QuantityError as exc:
        raise ResourceError(f"{t_at}.resourcesPerNode: {exc}") from None
    pod, container, p_at = _patched_trainer_pod(spec, where)
    env = (*_fields.env(container, f"{p_at}.containers[0]"), *env)  # the trainer's own env wins, as the Trainer's
    metadata = _fields.mapping(manifest.get("metadata"), f"{where}.metadata")
    refusal = ""
    if not name.startswith(TORCH_RUNTIME_PREFIX):
        refusal = (
            f"the TrainJob references the runtime {name!r}; here a TrainJob runs only as the Trainer's torch plugin "
            f"runs it (its runtimes are named {TORCH_RUNTIME_PREFIX}*, e.g. torch-distributed); submit this "
            "workflow to a cluster, or reference torch-distributed"
        )
    deadline = spec.get("activeDeadlineSeconds")
    return LocalJob(
        "TrainJob",
        "",
        argv=argv,
        env=env,
        mounts=_mounts(pod, p_at, container, f"{p_at}.containers[0]") if pod else (),
        deadline_s=None if deadline is None else _fields.number(deadline, f"{where}.spec.activeDeadlineSeconds"),
        devices=_devices(resources, nodes, f"{t_at}.resourcesPerNode"),
        refusal=refusal,
        train=TrainLayout(
            _fields.text(metadata.get("name", ""), f"{where}.metadata.name"),
            nodes,
            procs_per_node(trainer.get("numProcPerNode"), resources, f"{t_at}.numProcPerNode"),
            requests,
        ),
        pod_annotations=_pod_annotations(spec, where),
    )


def procs_per_node(value: Any, resources: Mapping[str, Any], at: str) -> str:
    """PET_NPROC_PER_NODE as the torch plugin sets it from numProcPerNode (default "auto") and resourcesPerNode.

    "auto" on a node asking no GPU, and "cpu", become the node's CPU count (limits first, else requests; at least
    1); "auto" with GPUs and "gpu" stay for torchrun to resolve (the node's GPU count); a number is itself.
    """
    text = _fields.text("auto" if value is None else value, at)
    if text not in ("auto", "cpu", "gpu"):
        if not text.isdigit() or int(text) < 1:
            raise ResourceError(f"{at} must be a positive number, auto, cpu or gpu, got {text!r}")
        return text
    limits, requests = (_fields.mapping(resources.get(key), f"{at}.{key}") for key in ("limits", "requests"))
    for section in (limits, requests):
        if text == "auto" and any("gpu" in str(name).lower() for name in section):
            return text
        if text != "gpu" and "cpu" in section:
            try:
                return str(max(1, math.ceil(quantity(section["cpu"], "cpu") / 1000)))
            except QuantityError as exc:
                raise ResourceError(f"{at}: resourcesPerNode's cpu: {exc}") from None
    return "1" if text == "cpu" else text


def _patched_trainer_pod(spec: Mapping[str, Any], where: str) -> tuple[Mapping[str, Any], Mapping[str, Any], str]:
    """The `node` job's pod spec as spec.runtimePatches patch it, its `node` container, and where it is."""
    pod: Mapping[str, Any] = {}
    container: Mapping[str, Any] = {}
    at = ""
    for i, patch in enumerate(_fields.mappings(spec.get("runtimePatches"), f"{where}.spec.runtimePatches")):
        for j, job in enumerate(_replicated_jobs(patch, f"{where}.spec.runtimePatches[{i}]")):
            j_at = f"{where}.spec.runtimePatches[{i}].trainingRuntimeSpec.template.spec.replicatedJobs[{j}]"
            if job.get("name") != TRAINER_JOB:
                raise ResourceError(
                    f"{j_at}.name is {job.get('name')!r}: the torch runtime's one replicated job is {TRAINER_JOB!r}"
                )
            at = f"{j_at}.template.spec.template.spec"
            pod = _fields.mapping(_template(job, j_at).get("spec"), at)
            _fields.check_keys(pod, at, _POD_USED, _POD_CLUSTER_ONLY)
            for k, patched in enumerate(_fields.mappings(pod.get("containers"), f"{at}.containers")):
                if patched.get("name") == TRAINER_JOB:
                    _fields.check_keys(
                        patched, f"{at}.containers[{k}]", {"name", "env", "volumeMounts"}, {"securityContext"}
                    )
                    container = patched
    return pod, container, at


def _replicated_jobs(patch: Mapping[str, Any], at: str) -> list[Mapping[str, Any]]:
    runtime_spec = _fields.mapping(patch.get("trainingRuntimeSpec"), f"{at}.trainingRuntimeSpec")
    template = _fields.mapping(runtime_spec.get("template"), f"{at}.trainingRuntimeSpec.template")
    job_set = _fields.mapping(template.get("spec"), f"{at}.trainingRuntimeSpec.template.spec")
    return _fields.mappings(job_set.get("replicatedJobs"), f"{at}.trainingRuntimeSpec.template.spec.replicatedJobs")


def _template(job: Mapping[str, Any], at: str) -> Mapping[str, Any]:
    """A replicated job's pod template (its Job's spec.template)."""
    job_spec = _fields.mapping(
        _fields.mapping(job.get("template"), f"{at}.template").get("spec"), f"{at}.template.spec"
    )
    return _fields.mapping(job_spec.get("template"), f"{at}.template.spec.template")


def _pod_annotations(spec: Mapping[str, Any], where: str) -> tuple[tuple[str, str], ...]:
    """The trainer pods' annotations, as the runtime patches give them (Kueue's podset topology among them)."""
    found: dict[str, str] = {}
    for i, patch in enumerate(_fields.mappings(spec.get("runtimePatches"), f"{where}.spec.runtimePatches")):
        for j, job in enumerate(_replicated_jobs(patch, f"{where}.spec.runtimePatches[{i}]")):
            at = f"{where}.spec.runtimePatches[{i}].trainingRuntimeSpec.template.spec.replicatedJobs[{j}].template"
            found.update(template_annotations(_fields.mapping(job.get("template"), at).get("spec") or {}, f"{at}.spec"))
    return tuple(found.items())


def _devices(resources: Mapping[str, Any], nodes: int, at: str) -> tuple[DeviceRequest, ...]:
    """The GPUs (or Neuron devices) every node's pod asks for: the larger of request and limit."""
    found = []
    for resource in (GPU_RESOURCE, *NEURON_RESOURCES):
        counts = [
            int(_fields.number(section[resource], f"{at}.{key}.{resource}"))
            for key in ("requests", "limits")
            if resource in (section := _fields.mapping(resources.get(key), f"{at}.{key}"))
        ]
        if counts and max(counts) > 0:
            found.append(DeviceRequest(resource, "trainer", nodes, max(counts)))
    return tuple(found)
