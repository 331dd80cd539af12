"""Task handlers: what one attempt of a container or resource template does on this machine.

One small interface (KFP's local runner has the same seam, one handler per way of running a task): a handler gets
the template and a TaskContext (the node, its substitution scope, its folder, and the run's services: host folders
for volumes and a supervised process with its log) and returns an Attempt. The executor owns retries, timing,
status and stopping; a handler only turns a template into a process.

- ContainerHandler: the container's command and args, `python` being this interpreter, with its env; a Secret it
  mounts is the attempt's read-only copy of it (secret_mounts.py).
- ResourceHandler: the object the manifest creates, described by the handler of its kind in resources.py (a
  RayJob's entrypoint under `bash -c` with the head container's env and mounts, a PodGroup admitted at once);
  new kinds register there. A TrainJob's pods run as the Trainer runs them (train_pods.py), reporting to its
  status endpoint (trainer_status_server.py). An object of a run service's kind (services.py) goes to that service
  of the run, whose processes outlive the task (a delete ends them); a container's argv and env values that are an
  address of something a run service runs get the local one.
"""

from __future__ import annotations

import os
import posixpath
import re
import shlex
import shutil
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import eksflow.local.job_kinds  # noqa: F401  # importing it registers eksflow's kinds of resource object
from eksflow.local import mpi_pods, ray_pods, resources, services, topology_domains, train_pods
from eksflow.local.model import ContainerTemplate, Mount, Output, PathRules, ResourceTemplate, Template
from eksflow.local.paths import PathMap, map_argv, map_env, map_shell_words, path_rules
from eksflow.local.phase import Phase
from eksflow.local.pod_network import PodNetworkError
from eksflow.local.retry import Attempt
from eksflow.local.rundir import writing
from eksflow.local.secret_mounts import copy_folder, read_only_secrets
from eksflow.local.sim_nodes import SimulatedCluster
from eksflow.local.status import NAMESPACE
from eksflow.local.substitution import Scope, UnresolvedError
from eksflow.local.trainer_status_server import TrainerStatusServer, TrainerStatusServerError

_PYTHON = re.compile(r"python(\d+(\.\d+)?)?")  # python, python3, python3.11: all mean the project's interpreter
_PENDING_CHECK_S = 1.0  # how often a Pending TrainJob's placement is looked at again


@dataclass
class TaskContext:
    """What a handler may use for one attempt of node `key`."""

    key: str
    attempt: int  # 0 for the first
    scope: Scope  # inputs, workflow values and {{retries}}
    task_dir: Path  # the node's scratch folder (outputs/, progress, bin/)
    host_folder: Callable[[Mount], str]  # the host folder standing in for a volume mount (created)
    env: Mapping[str, str]  # the environment task processes start from (this one's, plus the run's env)
    execute: Callable[[list[str], dict[str, str], float | None], Attempt]  # run argv with env, supervised and logged
    services: services.RunServices | None = None  # the run's services: processes for the run (None: a run without)
    stop_reason: Callable[[], str] = lambda: ""  # why the run is stopping; "" while it is not
    nodes: NodesContext | None = None  # the run's simulated nodes (`run --nodes N`); None: this machine is the node
    spawn: ray_pods.Spawn | None = None  # start a process of the task's beside its own (a TrainJob's other pods)
    reap: ray_pods.Reap | None = None  # end it


@dataclass
class NodesContext:
    """What a handler needs to run an object's pods on the simulated nodes (sim_nodes.py)."""

    cluster: SimulatedCluster
    spawn: ray_pods.Spawn  # start a pod's process, supervised like a task's (process.start)
    reap: ray_pods.Reap  # end it (process.end)
    pods_changed: Callable[[list[dict[str, str]]], None]  # the node's pods, for status.json
    pending: Callable[[str], None] = lambda reason: None  # the task waits for its pods' placement ("": no longer)


class TaskHandler(Protocol):
    """Runs one attempt of a template's task."""

    def run(self, template: Template, ctx: TaskContext) -> Attempt:
        """Do the attempt; never raises for a task's own failure (that is an Attempt with phase Failed/Error)."""


def _refused(message: str) -> Attempt:
    """An attempt that could not start and would fail the same way again."""
    return Attempt(Phase.ERROR, None, message, 0.0, retriable=False)


class ContainerHandler:
    """A container template as a local process."""

    def run(self, template: Template, ctx: TaskContext) -> Attempt:
        """Run the container's command; read its output parameter files."""
        assert isinstance(template, ContainerTemplate)
        try:
            output_paths = {output.name: ctx.scope.substitute(output.path or "") for output in template.outputs}
            # A Secret is mounted as the attempt's read-only copy of it (eksflow.local.secret_mounts).
            pairs = [
                (m.mount_path, str(copy_folder(ctx.task_dir, m)) if m.scope == "secret" else ctx.host_folder(m))
                for m in template.mounts
            ]
            mounted = [m.mount_path for m in template.mounts]
            for path in output_paths.values():
                folder = posixpath.dirname(path)
                # An output written into a mounted volume is read from that volume, as Argo does.
                if not any(folder == m or folder.startswith(m + "/") for m in mounted):
                    pairs.append((folder, str(ctx.task_dir / "outputs")))
            paths = PathMap(pairs)
            argv = map_argv(
                [ctx.scope.substitute(a) for a in (*template.command, *template.args)], paths, template.paths
            )
            env = map_env(((n, ctx.scope.substitute(v)) for n, v in template.env), paths, template.paths)
            if ctx.services is not None:  # an address of something a run service runs becomes the local one
                argv = ctx.services.local_argv(argv)
                env = {**ctx.services.task_env(), **{n: ctx.services.local_value(v) for n, v in env.items()}}
        except UnresolvedError as exc:
            return _refused(str(exc))
        if _PYTHON.fullmatch(os.path.basename(argv[0])):
            argv[0] = sys.executable  # the project's environment, not whatever `python` is on PATH
        shutil.rmtree(ctx.task_dir / "outputs", ignore_errors=True)  # a fresh pod: no stale outputs
        with writing(ctx.task_dir / "outputs"):
            (ctx.task_dir / "outputs").mkdir(parents=True, exist_ok=True)
        with read_only_secrets(template.mounts, ctx.host_folder, ctx.task_dir):
            attempt = ctx.execute(argv, env, template.deadline_s)
        outputs, missing = read_outputs(template.outputs, output_paths, paths)
        attempt.outputs = outputs
        if attempt.phase is Phase.SUCCEEDED and missing:
            attempt.phase, attempt.message = Phase.FAILED, missing
        return attempt


def read_outputs(
    declared: tuple[Output, ...], output_paths: Mapping[str, str], paths: PathMap
) -> tuple[dict[str, str], str]:
    """Output values (a value that is a host path as a whole is shown as its container path) and what is missing."""
    outputs: dict[str, str] = {}
    missing: list[str] = []
    for output in declared:
        host = Path(paths.to_host(output_paths[output.name]))
        if host.is_file():
            value = host.read_text(encoding="utf-8", errors="replace")
            # Argo trims one trailing newline "for user convenience"; `echo x > file` gives "x".
            outputs[output.name] = paths.to_container(value.removesuffix("\n"))
        elif output.default is not None:
            outputs[output.name] = output.default
        else:
            missing.append(
                f"output parameter {output.name!r}: {output_paths[output.name]} was not written (host: {host})"
            )
    return outputs, "; ".join(missing)


class ResourceHandler:
    """A resource template: the created object, run by the local handler of its kind (resources.py)."""

    def run(self, template: Template, ctx: TaskContext) -> Attempt:
        """Describe the substituted object and run what it runs here."""
        assert isinstance(template, ResourceTemplate)
        where = f"template {template.name!r}: resource.manifest"
        if template.action == "delete":
            return _delete(template, where, ctx)
        try:
            job = resources.describe(ctx.scope.substitute(template.manifest), where)
        except (UnresolvedError, resources.ResourceError) as exc:
            return _refused(str(exc))
        if job.note:  # nothing to do here (a PodGroup)
            return Attempt(Phase.SUCCEEDED, None, job.note, 0.0)
        if job.service_object is not None:
            return _apply(job.service_object, where, ctx)
        refusal = resources.refusal(job)
        if refusal:  # no retry can add a GPU: fail once, before anything starts
            return Attempt(Phase.FAILED, None, refusal, 0.0, retriable=False)
        mounts = [
            Mount(m.mount_path, "run" if m.claim is None else "state", m.claim or m.volume, m.sub_path)
            for m in job.mounts
        ]
        paths = PathMap((m.mount_path, ctx.host_folder(m)) for m in mounts)
        # The template's annotations say which values are paths; a RayJob may carry them itself.
        rules = template.paths if template.paths != PathRules(None, None) else path_rules(dict(job.annotations))
        command, unsafe = ("", "") if job.argv else map_shell_words(job.entrypoint, paths, rules)
        if unsafe:
            return _refused(
                f"{where}: the entrypoint would get the folder {unsafe!r}, which a shell command line cannot carry "
                "unquoted; use a --state-dir whose path has only letters, digits and @%+=:,./-"
            )
        env = map_env(job.env, paths, rules)
        with writing(ctx.task_dir):  # the shims and what the kind prepares (an MPIJob's hostfile) live there
            env["PATH"] = os.pathsep.join(
                [
                    str(python_shims(ctx.task_dir / "bin")),
                    os.path.dirname(sys.executable),  # this environment's tools (ray, torchrun, mpirun) first
                    env.get("PATH") or ctx.env.get("PATH", ""),
                ]
            )
            if job.prepare is not None and not (ctx.nodes is not None and job.mpi is not None):
                env.update(job.prepare(ctx.task_dir))  # on simulated nodes the pods are what it stands in for
        argv = map_argv(list(job.argv), paths, rules) if job.argv else ["bash", "-c", command]
        deadlines = [d for d in (template.deadline_s, job.deadline_s) if d is not None]
        deadline = min(deadlines) if deadlines else None
        if ctx.nodes is None or not (job.ray_groups or job.mpi or job.train):
            return _train_job(job.train, ctx, argv, env, deadline) if job.train else ctx.execute(argv, env, deadline)
        name = job.mpi.name if job.mpi else job.train.name if job.train else _ray_job_name(ctx.key)
        unplaced, waited = _placed(job, name, ctx, ctx.nodes, deadline)
        if unplaced is not None:
            return unplaced
        deadline = None if deadline is None else max(0.0, deadline - waited)
        try:
            if job.train is not None:
                return _train_job(job.train, ctx, argv, env, deadline)
            if job.mpi is not None:
                return _mpi_on_nodes(job.mpi, ctx, ctx.nodes, argv, env, deadline)
            group_envs = {group.role: map_env(group.env, paths, rules) for group in job.ray_groups}
            return _ray_on_nodes(job, name, ctx, ctx.nodes, argv, env, group_envs, deadline)
        finally:
            ctx.nodes.cluster.confine(name, None)


def _ray_job_name(key: str) -> str:
    """The name a RayJob's pods start with: its task's, as a DNS label."""
    return re.sub(r"[^a-z0-9-]+", "-", key.lower()).strip("-")[:40] or "rayjob"


def _placed(
    job: resources.LocalJob, name: str, ctx: TaskContext, nodes: NodesContext, deadline: float | None
) -> tuple[Attempt | None, float]:
    """Confine the job's pods to the topology domain they ask for, once one holds them (Kueue admits the job then).

    Until then the task is Pending with the reason; an Attempt if the run stops or the deadline passes first. The
    seconds it waited.
    """
    ask = topology_domains.topology_ask(job.pod_annotations)
    if job.train is not None:
        pods = job.train.nodes
    else:  # an MPIJob's workers, a RayJob's worker pods: the training pods, each asking for a node's worth
        pods = job.mpi.workers if job.mpi is not None else sum(group.replicas for group in job.ray_groups[1:]) or 1
    started, pending = time.monotonic(), False
    while True:
        nodes.cluster.replace_lost()  # Karpenter: a node for each one lost, for the pods it would have held
        placement = topology_domains.place(nodes.cluster.nodes, pods, ask, f"{job.kind} {name}")
        waited = time.monotonic() - started
        if not placement.pending:
            break
        nodes.pending(placement.pending)
        pending = True
        if ctx.stop_reason() or (deadline is not None and waited > deadline):
            why = ctx.stop_reason() or f"exceeded activeDeadlineSeconds={deadline:g}"
            return Attempt(Phase.FAILED, None, f"{placement.pending}; {why}", waited), waited
        time.sleep(_PENDING_CHECK_S)
    if pending:
        nodes.pending("")
    nodes.cluster.confine(name, placement.domain)
    return None, waited


def _ray_on_nodes(
    job: resources.LocalJob,
    name: str,
    ctx: TaskContext,
    nodes: NodesContext,
    argv: list[str],
    env: dict[str, str],
    group_envs: Mapping[str, Mapping[str, str]],
    deadline: float | None,
) -> Attempt:
    """A RayJob as KubeRay runs it, on the simulated nodes: its pods (ray_pods.py), the entrypoint in the head."""
    pods = ray_pods.RayPods(
        nodes.cluster, name, job, env={**ctx.env, "PATH": env["PATH"]}, logs=ctx.task_dir / "pods",
        spawn=nodes.spawn, reap=nodes.reap, changed=nodes.pods_changed,
    )  # fmt: skip
    try:
        pods.start(group_envs)
        attempt = ctx.execute(
            [*pods.exec_in_head(), *argv],
            {**env, **pods.env({}), "RAY_ADDRESS": pods.address},
            deadline,
        )
    except (ray_pods.RayPodsError, PodNetworkError, OSError) as exc:
        attempt = Attempt(Phase.ERROR, None, f"the RayJob's pods: {exc}", 0.0)
    finally:
        pods.close()
    if pods.replaced:
        attempt.message = "; ".join(
            filter(None, [attempt.message, "worker pods replaced: " + ", ".join(pods.replaced)])
        )
    return attempt


def _mpi_on_nodes(
    layout: resources.MpiLayout,
    ctx: TaskContext,
    nodes: NodesContext,
    argv: list[str],
    env: dict[str, str],
    deadline: float | None,
) -> Attempt:
    """An MPIJob as the MPI Operator runs it, on the simulated nodes: sshd workers, mpirun in the launcher pod."""
    if mpi_pods.sshd() is None:  # no retry can install it
        return Attempt(Phase.FAILED, None, mpi_pods.INSTALL_SSHD, 0.0, retriable=False)
    pods = mpi_pods.MpiPods(
        nodes.cluster, layout, folder=ctx.task_dir / "ssh", logs=ctx.task_dir / "pods", path=env["PATH"],
        spawn=nodes.spawn, reap=nodes.reap, changed=nodes.pods_changed,
    )  # fmt: skip
    try:
        launcher_env = pods.start()
        attempt = ctx.execute([*pods.in_launcher(), *argv], {**env, **launcher_env}, deadline)
    except (mpi_pods.MpiPodsError, PodNetworkError, OSError, subprocess.CalledProcessError) as exc:
        attempt = Attempt(Phase.ERROR, None, f"the MPIJob's pods: {exc}", 0.0)
    finally:
        pods.close()
    return attempt


def _train_job(
    layout: resources.TrainLayout, ctx: TaskContext, argv: list[str], env: dict[str, str], deadline: float | None
) -> Attempt:
    """A TrainJob as the Trainer runs it: a pod per node (train_pods.py), node 0's the task's; its status endpoint."""
    assert ctx.spawn is not None and ctx.reap is not None
    nodes = ctx.nodes
    try:
        endpoint = TrainerStatusServer(
            ctx.task_dir, NAMESPACE, layout.name, nodes.cluster.network.gateway if nodes else "127.0.0.1"
        )
    except (TrainerStatusServerError, OSError, ssl.SSLError) as exc:
        return Attempt(Phase.ERROR, None, f"the TrainJob's status endpoint: {exc}", 0.0)
    with endpoint:
        pods = train_pods.TrainPods(
            layout, nodes.cluster if nodes else None, logs=ctx.task_dir / "pods", spawn=ctx.spawn, reap=ctx.reap,
            changed=nodes.pods_changed if nodes else lambda pods: None, pod_env=endpoint.pod_env,
        )  # fmt: skip
        attempt = Attempt(Phase.ERROR, None, "the TrainJob's pods did not start", 0.0)
        try:
            main = pods.start(argv, {**ctx.env, **env})
            attempt = ctx.execute(main, {**env, **pods.node_env(0)}, deadline)
        except (train_pods.TrainPodsError, PodNetworkError, OSError) as exc:
            attempt = Attempt(Phase.ERROR, None, f"the TrainJob's pods: {exc}", 0.0)
        finally:
            failure = pods.close(succeeded=attempt.phase is Phase.SUCCEEDED)
    if failure:
        attempt.phase = Phase.FAILED
        attempt.message = "; ".join(filter(None, [failure, attempt.message]))
    return attempt


def _apply(manifest: Mapping[str, object], where: str, ctx: TaskContext) -> Attempt:
    """An object of a run service's kind, applied by the run's service: processes for the run's lifetime."""
    if ctx.services is None:
        return _refused(f"{where}: {manifest.get('kind')} is applied by a run service, and this task has none")
    started = time.monotonic()
    try:
        note = ctx.services.apply(manifest, where, ctx.stop_reason, ctx.nodes)
    except services.RunServiceError as exc:
        return Attempt(Phase.FAILED, None, str(exc), time.monotonic() - started, retriable=exc.retriable)
    return Attempt(Phase.SUCCEEDED, 0, note, time.monotonic() - started)


def _delete(template: ResourceTemplate, where: str, ctx: TaskContext) -> Attempt:
    """An object of a run service's kind, deleted by the run's service: what it ran ends, as on the cluster."""
    started = time.monotonic()
    try:
        manifest = services.deleted(ctx.scope.substitute(template.manifest), where)
        if ctx.services is None:
            return _refused(f"{where}: {manifest.get('kind')} is deleted by a run service, and this task has none")
        note = ctx.services.delete(manifest, where)
    except UnresolvedError as exc:
        return _refused(str(exc))
    except services.RunServiceError as exc:
        return Attempt(Phase.FAILED, None, str(exc), time.monotonic() - started, retriable=exc.retriable)
    return Attempt(Phase.SUCCEEDED, 0, note, time.monotonic() - started)


def python_shims(folder: Path) -> Path:
    """`python` and `python3` that exec this interpreter, so a shell entrypoint's `python` is the project's."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("python", "python3"):
        shim = folder / name
        shim.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} "$@"\n', encoding="utf-8")
        shim.chmod(0o755)
    return folder


HANDLERS: dict[type[Template], TaskHandler] = {
    ContainerTemplate: ContainerHandler(),
    ResourceTemplate: ResourceHandler(),
}


def handler_for(template: Template) -> TaskHandler:
    """The handler that runs `template`'s kind."""
    return HANDLERS[type(template)]
