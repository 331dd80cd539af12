"""What the objects an Argo resource template creates become on this machine.

- RayJob (ray.io/v1): its `spec.entrypoint` runs as a local process under `bash -c` (Ray's job manager runs an
  entrypoint through a shell too) with the head container's env. The entrypoint starts Ray itself (`ray.init` with
  no RAY_ADDRESS starts a local Ray), so nothing else is started. A job whose pods request NVIDIA GPUs or
  Neuron devices this machine lacks is refused before anything starts, with the way out.
- PodGroup (scheduling.volcano.sh): gang admission by the Volcano scheduler; locally there is nothing to create.
- MPIJob (kubeflow.org/v2beta1): the launcher's command (Open MPI's mpirun) as a local process, with every worker
  pod being this host: a local hostfile with all their slots, the workers' and launcher's env, MASTER_ADDR
  127.0.0.1. See mpijob.py.
- TrainJob (trainer.kubeflow.org/v1alpha1): torchrun in one pod per node, as the Kubeflow Trainer's torch plugin
  runs it (PET_* in each pod; node 0's pod hosts the rendezvous): processes on this host, or pods on the simulated
  nodes placed by their topology annotations. See trainjob.py and train_pods.py.
- Job (batch.volcano.sh): torchrun in every pod, meeting at a rendezvous addressed by the job's DNS names; it needs
  the cluster (and, as eksflow renders it, Trainium), so it is refused with the way out.
- The kinds a run service registered (services.py; e.g. a model server's Deployment and Service): handed to that
  service of the run, which runs them as local processes for the run's lifetime.

Each kind has a describer that turns its object into a LocalJob (what runs here); `register_kind` adds one, so a
new kind (an MPIJob under local mpirun) is one function and one line: eksflow's own are registered in job_kinds.py,
a run service's as it is registered (services.py).
`describe` reads a manifest whose `{{...}}` references are already substituted (Argo substitutes the manifest text
before parsing it); the executor also calls it up front with placeholders, so a malformed manifest, an
unsupported kind or a Job's refusal (`LocalJob.refusal`; a kind is never templated) fails before anything runs.
Cluster-only fields (scheduling, lifecycle, TTLs, KubeRay's own `backoffLimit` resubmissions) have nothing to act
on locally and are ignored.
"""

from __future__ import annotations

import glob
import re
import shutil
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from eksflow.errors import EXIT_BAD_INPUT, EksflowError
from eksflow.local.fields import FieldReader
from eksflow.local.node import QuantityError, Requests, container_requests
from eksflow.profiles import GPU_RESOURCE

NEURON_RESOURCES = ("aws.amazon.com/neuron", "aws.amazon.com/neuroncore", "aws.amazon.com/neurondevice")
RAYJOB_API = "ray.io/v1"
PODGROUP_GROUP = "scheduling.volcano.sh/"
VOLCANO_JOB_GROUP = "batch.volcano.sh/"
LOCAL_WAY_OUT = "run the cpu profile here (`run --variant cpu`) or `submit` to a cluster"
SHM_MOUNT = "/dev/shm"  # a local process already has the machine's memory-backed /dev/shm

_RAYJOB_USED = frozenset({"entrypoint", "rayClusterSpec", "activeDeadlineSeconds"})
_RAYJOB_CLUSTER_ONLY = frozenset({
    "backoffLimit", "clusterSelector", "deletionPolicy", "deletionStrategy", "entrypointNumCpus",
    "entrypointNumGpus", "entrypointResources", "jobId", "managedBy", "metadata", "shutdownAfterJobFinishes",
    "submissionMode", "submitterConfig", "submitterPodTemplate", "suspend", "ttlSecondsAfterFinished",
})  # fmt: skip
_RAY_PARAM = re.compile(r"[a-z][a-z0-9-]*")  # KubeRay turns each key into `--key=value` for `ray start`
_HINTS = {
    "runtimeEnvYAML": "put environment variables in the head container's env; the code is this project's",
    "valueFrom": "give a literal value",
}


class ResourceError(EksflowError):
    """A resource manifest the local executor cannot run; the message names the field and the fix."""

    label = "resource error"
    exit_code = EXIT_BAD_INPUT


_fields = FieldReader(ResourceError, _HINTS)


@dataclass(frozen=True)
class PodMount:
    """A volume mount of the pod that runs the entrypoint."""

    mount_path: str
    volume: str
    claim: str | None  # the PersistentVolumeClaim's name; None for emptyDir and other pod-scoped volumes
    sub_path: str


@dataclass(frozen=True)
class DeviceRequest:
    """Accelerators one group of pods asks for, e.g. 2 pods x 4 nvidia.com/gpu."""

    resource: str
    group: str  # where in the manifest, e.g. "workerGroupSpecs[0] 'gpu'"
    pods: int
    per_pod: int

    @property
    def total(self) -> int:
        """Devices of this resource the whole group needs."""
        return self.pods * self.per_pod

    def __str__(self) -> str:
        return f"{self.group}: {counted(self.pods, 'pod')} x {self.per_pod} {self.resource}"


@dataclass(frozen=True)
class RayGroup:
    """A RayJob's head or worker group as KubeRay starts it: `ray start` with its params in each of its pods."""

    role: str  # "head", or the worker group's groupName
    replicas: int
    start_params: tuple[tuple[str, str], ...]  # rayStartParams, each becoming `--key=value`
    env: tuple[tuple[str, str], ...]  # its Ray container's env
    requests: Requests  # one pod's CPU and memory requests (and what KubeRay derives num-cpus from)
    pre_stop: tuple[str, ...] = ()  # its container's preStop exec command, run in the pod before SIGTERM
    grace_s: float = 30.0  # terminationGracePeriodSeconds: from the preStop hook to SIGKILL


@dataclass(frozen=True)
class MpiLayout:
    """An MPIJob's pods as the MPI Operator makes them: `<name>-worker-<i>` running sshd, and the launcher."""

    name: str  # the MPIJob's: its pods' host names start with it, and its headless Service (their subdomain) is it
    workers: int
    slots: int  # slotsPerWorker: the hostfile's slots per worker
    launcher: Requests  # one pod's CPU and memory requests
    worker: Requests


@dataclass(frozen=True)
class TrainLayout:
    """A TrainJob's pods as the Trainer makes them: `<name>-node-0-<i>`, one per node, each running torchrun."""

    name: str  # the TrainJob's: its pods' names start with it, and its headless Service (their subdomain) is it
    nodes: int  # numNodes
    procs_per_node: str  # PET_NPROC_PER_NODE, as the torch plugin resolves numProcPerNode
    requests: Requests  # one pod's CPU and memory requests (resourcesPerNode)


@dataclass(frozen=True)
class LocalJob:
    """What one resource manifest does here: a shell entrypoint to run, or a phase decided without a process."""

    kind: str  # RayJob | MPIJob | TrainJob | PodGroup | Job
    entrypoint: str  # a shell command line; "" when nothing runs here or `argv` does
    env: tuple[tuple[str, str], ...] = ()
    mounts: tuple[PodMount, ...] = ()
    deadline_s: float | None = None
    devices: tuple[DeviceRequest, ...] = ()
    note: str = ""  # why nothing runs (PodGroup): the Succeeded node's message
    refusal: str = ""  # why it cannot run anywhere but a cluster: the Failed node's message
    annotations: tuple[tuple[str, str], ...] = ()  # the object's metadata.annotations (eksflow.dev/path-args, ...)
    argv: tuple[str, ...] = ()  # a command run without a shell (an MPIJob launcher's), in place of `entrypoint`
    # Run-time environment the cluster's controller would provide (an MPIJob's hostfile), given the task's folder.
    prepare: Callable[[Path], dict[str, str]] | None = None
    service_object: Mapping[str, Any] | None = None  # an object of a run service's kind: it applies it (services.py)
    ray_groups: tuple[RayGroup, ...] = ()  # a RayJob's head and worker groups, for simulated nodes (ray_pods.py)
    mpi: MpiLayout | None = None  # an MPIJob's pods, for simulated nodes (mpi_pods.py)
    train: TrainLayout | None = None  # a TrainJob's pods, here or on simulated nodes (train_pods.py)
    # The training pods' template annotations (Kueue's podset topology among them: topology_domains.py)
    pod_annotations: tuple[tuple[str, str], ...] = ()


Describer = Callable[[Mapping[str, Any], str], LocalJob]
_KINDS: list[tuple[str, str, Describer]] = []  # (kind, apiVersion or group prefix ending in "/", describer)


def register_kind(kind: str, api_version: str, describer: Describer) -> None:
    """Run objects of `kind` with `describer`; `api_version` is exact, or a group ("group/") for any version."""
    _KINDS.append((kind, api_version, describer))


def _describer(kind: str, api_version: str) -> Describer | None:
    for known, version, describer in _KINDS:
        if kind == known and (api_version == version or (version.endswith("/") and api_version.startswith(version))):
            return describer
    return None


def describe(text: str, where: str) -> LocalJob:
    """Read a substituted resource manifest; raise ResourceError for anything that cannot run here."""
    try:
        manifest = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ResourceError(
            f"{where} is not valid YAML after parameter substitution (a value with YAML quoting characters breaks "
            f"it on Argo too): {exc}"
        ) from None
    manifest = _fields.mapping(manifest, where)
    api_version = _fields.text(manifest.get("apiVersion"), f"{where}.apiVersion")
    kind = _fields.text(manifest.get("kind"), f"{where}.kind")
    describer = _describer(kind, api_version)
    if describer is None:
        raise ResourceError(
            f"{where}: {kind} ({api_version}) does not run locally; resource templates run here only for the kinds "
            f"registered: {', '.join(f'{k} ({v})' for k, v, _ in _KINDS)}; submit this workflow to a cluster"
        )
    job = describer(manifest, where)
    metadata = _fields.mapping(manifest.get("metadata"), f"{where}.metadata")
    notes = _fields.mapping(metadata.get("annotations"), f"{where}.metadata.annotations")
    return replace(job, annotations=tuple((str(k), str(v)) for k, v in notes.items()))


def pod_requests(container: Mapping[str, Any], at: str) -> Requests:
    """A container's CPU and memory requests; ResourceError naming `at` for a bad quantity."""
    try:
        return container_requests(_fields.mapping(container.get("resources"), f"{at}.resources"))
    except QuantityError as exc:
        raise ResourceError(f"{at}.resources: {exc}") from None


def describe_podgroup(manifest: Mapping[str, Any], where: str) -> LocalJob:
    """A Volcano PodGroup: gang admission on a cluster, nothing to run here."""
    return LocalJob(
        "PodGroup", "", note="PodGroup: gang admission by the Volcano scheduler on a cluster; nothing to create here"
    )


def refusal(job: LocalJob) -> str:
    """Why `job` cannot run on this machine ("" if it can): its own refusal, or devices this machine lacks."""
    if job.refusal:
        return job.refusal
    for resource in dict.fromkeys(d.resource for d in job.devices):
        requests = [d for d in job.devices if d.resource == resource]
        needed = sum(d.total for d in requests)
        neuron = resource in NEURON_RESOURCES
        have, how = neuron_devices() if neuron else nvidia_gpus()
        if needed > have:
            what = counted(needed, "Neuron device" if neuron else "NVIDIA GPU")
            return (
                f"the {job.kind} needs {what} ({'; '.join(map(str, requests))}), this machine has {have or 'none'} "
                f"({how}){'; Neuron cores need Trainium' if neuron else ''}; {LOCAL_WAY_OUT}"
            )
    return ""


def nvidia_gpus() -> tuple[int, str]:
    """NVIDIA GPUs on this machine, and how that was found out."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0, "no nvidia-smi on PATH"
    try:
        listed = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return 0, f"nvidia-smi -L failed: {exc}"
    return sum(line.startswith("GPU ") for line in listed.stdout.splitlines()), "nvidia-smi -L"


def neuron_devices() -> tuple[int, str]:
    """AWS Neuron devices on this machine (the Neuron driver's /dev/neuronN), and how that was found out."""
    return len(glob.glob("/dev/neuron[0-9]*")), "/dev/neuron*"


def describe_ray_job(manifest: Mapping[str, Any], where: str) -> LocalJob:
    """A RayJob: its entrypoint as a local process with the head container's env (ResourceError for a bad one)."""
    spec = _fields.mapping(manifest.get("spec"), f"{where}.spec")
    _fields.check_keys(spec, f"{where}.spec", _RAYJOB_USED, _RAYJOB_CLUSTER_ONLY)
    entrypoint = _fields.text(spec.get("entrypoint"), f"{where}.spec.entrypoint").strip()
    if not entrypoint:
        raise ResourceError(f"{where}.spec.entrypoint is empty; give the command the job runs")
    cluster = _fields.mapping(spec.get("rayClusterSpec"), f"{where}.spec.rayClusterSpec")
    at = f"{where}.spec.rayClusterSpec"
    head_group = _fields.mapping(cluster.get("headGroupSpec"), f"{at}.headGroupSpec")
    head_pod = _pod_spec(head_group, f"{at}.headGroupSpec")
    containers = _fields.mappings(head_pod.get("containers"), f"{at}.headGroupSpec.template.spec.containers")
    if not containers:
        raise ResourceError(f"{at}.headGroupSpec.template.spec.containers is empty; the head needs its Ray container")
    # The entrypoint runs where KubeRay runs it: in the head's Ray container (the first), with its env and mounts.
    head = containers[0]
    c_at = f"{at}.headGroupSpec.template.spec.containers[0]"
    if head.get("envFrom") is not None:
        raise ResourceError(f"{c_at}.envFrom is not supported locally; list the variables in env with values")
    devices = [
        DeviceRequest(resource, "headGroupSpec", 1, count)
        for resource, count in _pod_devices(head_pod, f"{at}.headGroupSpec").items()
    ]
    groups = [_ray_group("head", 1, head_group, head_pod, head, f"{at}.headGroupSpec")]
    annotations = template_annotations(head_group, f"{at}.headGroupSpec")
    for i, group in enumerate(_fields.mappings(cluster.get("workerGroupSpecs"), f"{at}.workerGroupSpecs")):
        g_at = f"{at}.workerGroupSpecs[{i}]"
        replicas = group.get("replicas", group.get("minReplicas", 1))
        pods = int(_fields.number(replicas, f"{g_at}.replicas")) * int(_fields.number(group.get("numOfHosts", 1), g_at))
        label = f"workerGroupSpecs[{i}] {group.get('groupName', '')!r}"
        worker_pod = _pod_spec(group, g_at)
        for resource, count in _pod_devices(worker_pod, g_at).items():
            devices.append(DeviceRequest(resource, label, pods, count))
        containers = _fields.mappings(worker_pod.get("containers"), f"{g_at}.template.spec.containers")
        if not containers:
            raise ResourceError(f"{g_at}.template.spec.containers is empty; a worker needs its Ray container")
        role = _fields.optional_text(group, "groupName", g_at) or "worker"
        groups.append(_ray_group(role, pods, group, worker_pod, containers[0], g_at))
        annotations.update(template_annotations(group, g_at))
    deadline = spec.get("activeDeadlineSeconds")
    return LocalJob(
        "RayJob",
        entrypoint,
        env=_fields.env(head, c_at),
        mounts=_mounts(head_pod, f"{at}.headGroupSpec.template.spec", head, c_at),
        deadline_s=None if deadline is None else _fields.number(deadline, f"{where}.spec.activeDeadlineSeconds"),
        devices=tuple(devices),
        ray_groups=tuple(groups),
        pod_annotations=tuple(annotations.items()),
    )


def template_annotations(owner: Mapping[str, Any], where: str) -> dict[str, str]:
    """The annotations of `owner`'s pod template (`template.metadata.annotations`)."""
    template = _fields.mapping(owner.get("template"), f"{where}.template")
    at = f"{where}.template.metadata"
    notes = _fields.mapping(_fields.mapping(template.get("metadata"), at).get("annotations"), f"{at}.annotations")
    return {str(key): _fields.text(value, f"{at}.annotations.{key}") for key, value in notes.items()}


def _ray_group(
    role: str, replicas: int, group: Mapping[str, Any], pod: Mapping[str, Any], container: Mapping[str, Any], at: str
) -> RayGroup:
    params = _fields.mapping(group.get("rayStartParams"), f"{at}.rayStartParams")
    for key in params:
        if not _RAY_PARAM.fullmatch(str(key)):
            raise ResourceError(f"{at}.rayStartParams: {key!r} is not a `ray start` option name")
    c_at = f"{at}.template.spec.containers[0]"
    requests = pod_requests(container, c_at)
    lifecycle = _fields.mapping(container.get("lifecycle"), f"{c_at}.lifecycle")
    pre_stop = _fields.mapping(_fields.mapping(lifecycle.get("preStop"), f"{c_at}.lifecycle.preStop").get("exec"), at)
    command = tuple(
        _fields.text(word, f"{c_at}.lifecycle.preStop.exec.command[{i}]")
        for i, word in enumerate(pre_stop.get("command") or [])
    )
    grace = pod.get("terminationGracePeriodSeconds", 30)
    return RayGroup(
        role,
        replicas,
        tuple((str(k), str(v)) for k, v in params.items()),
        _fields.env(container, c_at),
        requests,
        command,
        _fields.number(grace, f"{at}.template.spec.terminationGracePeriodSeconds"),
    )


def describe_volcano_job(manifest: Mapping[str, Any], where: str) -> LocalJob:
    """A Volcano Job: refused with the way out (torchrun across pods needs the cluster)."""
    spec = _fields.mapping(manifest.get("spec"), f"{where}.spec")
    devices = []
    for i, task in enumerate(_fields.mappings(spec.get("tasks"), f"{where}.spec.tasks")):
        t_at = f"{where}.spec.tasks[{i}]"
        pods = int(_fields.number(task.get("replicas", 1), f"{t_at}.replicas"))
        for resource, count in _pod_devices(_pod_spec(task, t_at), t_at).items():
            devices.append(DeviceRequest(resource, f"tasks[{i}] {task.get('name', '')!r}", pods, count))
    asks = f" ({', '.join(map(str, devices))})" if devices else ""
    trainium = "; Neuron cores need Trainium" if any(d.resource in NEURON_RESOURCES for d in devices) else ""
    return LocalJob(
        "Job",
        "",
        devices=tuple(devices),
        refusal=(
            f"a Volcano Job{asks} runs torchrun across pods that meet at the job's DNS names: cluster only"
            f"{trainium}; {LOCAL_WAY_OUT}"
        ),
    )


def _pod_spec(owner: Mapping[str, Any], where: str) -> Mapping[str, Any]:
    template = _fields.mapping(owner.get("template"), f"{where}.template")
    return _fields.mapping(template.get("spec"), f"{where}.template.spec")


def _pod_devices(pod: Mapping[str, Any], where: str) -> dict[str, int]:
    """Accelerators one pod asks for: each container's larger of request and limit, summed over containers."""
    found: dict[str, int] = {}
    for i, container in enumerate(_fields.mappings(pod.get("containers"), f"{where}.template.spec.containers")):
        at = f"{where}.template.spec.containers[{i}].resources"
        resources = _fields.mapping(container.get("resources"), at)
        sections = {key: _fields.mapping(resources.get(key), f"{at}.{key}") for key in ("requests", "limits")}
        for resource in (GPU_RESOURCE, *NEURON_RESOURCES):
            counts = [
                int(_fields.number(section[resource], f"{at}.{key}.{resource}"))
                for key, section in sections.items()
                if resource in section
            ]
            if counts and max(counts) > 0:
                found[resource] = found.get(resource, 0) + max(counts)
    return found


def _mounts(pod: Mapping[str, Any], pod_at: str, container: Mapping[str, Any], at: str) -> tuple[PodMount, ...]:
    claims: dict[str, str | None] = {}
    for i, declared in enumerate(_fields.mappings(pod.get("volumes"), f"{pod_at}.volumes")):
        v_at = f"{pod_at}.volumes[{i}]"
        claim = _fields.mapping(declared.get("persistentVolumeClaim"), f"{v_at}.persistentVolumeClaim")
        name = _fields.text(declared.get("name"), f"{v_at}.name")
        claims[name] = (
            _fields.text(claim.get("claimName"), f"{v_at}.persistentVolumeClaim.claimName") if claim else None
        )
    mounts = []
    for i, mount in enumerate(_fields.mappings(container.get("volumeMounts"), f"{at}.volumeMounts")):
        m_at = f"{at}.volumeMounts[{i}]"
        volume = _fields.text(mount.get("name"), f"{m_at}.name")
        if volume not in claims:
            raise ResourceError(f"{m_at}.name {volume!r} matches no volume in {pod_at}.volumes; declare the volume")
        mount_path = _fields.text(mount.get("mountPath"), f"{m_at}.mountPath").rstrip("/")
        if not mount_path.startswith("/"):
            raise ResourceError(f"{m_at}.mountPath must be absolute, got {mount_path!r}")
        if mount_path != SHM_MOUNT:
            mounts.append(
                PodMount(mount_path, volume, claims[volume], _fields.optional_text(mount, "subPath", m_at) or "")
            )
    return tuple(mounts)


def counted(n: int, thing: str) -> str:
    """`1 pod`, `2 pods`: a count and its noun, as the lines of this package say them."""
    return f"{n} {thing}" if n == 1 else f"{n} {thing}s"
