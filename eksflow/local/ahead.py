"""The tasks that may still start before or beside a pod: what the node asks the DAGs before a serving pod shares.

A serving pod (a Deployment's) that does not fit may load beside tasks that leave a core free (node.py), but only
if no task still to come asks for more: otherwise the engine would start beside validate-data and then take half
of the training that follows it. The tasks ahead of pod P are the tasks of every running DAG not yet started
(waiting for their dependencies, or queued for a parallelism slot), less those that depend on P's own task (they
start after it): Argo's DAG order is all there is to know of what comes next.

What each asks is read from its template without its inputs, which are bound only when it starts. A request that
needs them, a fan-out (how many pods at once) or a nested DAG is not known yet: it counts as asking for every core,
so the serving pod waits as it did before. A resource template asks nothing when its manifest has no pod template
(a Service, a ConfigMap), and a Deployment's pods share as P does.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from eksflow.local.model import ContainerTemplate, DagTemplate, ResourceTemplate, Template
from eksflow.local.node import Ahead, Requests, container_asks, resource_asks
from eksflow.local.scheduler import DagRun
from eksflow.local.substitution import Scope

_DEPLOYMENT = re.compile(r"^kind:\s*Deployment\s*$", re.MULTILINE)


def tasks_ahead(runs: Iterable[DagRun], key: str, templates: Mapping[str, Template]) -> list[Ahead]:
    """The tasks of `runs` that may still start before or beside pod `key`, and what each will ask (None: unknown)."""
    found: list[Ahead] = []
    for run in runs:
        after = _dependents(run, run.active[key].task) if key in run.active else set()
        for name in run.waiting:
            if name not in after:
                task = run.template.tasks[name]
                asks = None if task.loop else known_requests(templates[task.template], Scope(run.scope.workflow, {}))
                found.append((run.prefix + name, asks))
        found += [(unit.key, known_requests(unit.template, Scope(unit.values, unit.inputs))) for unit in run.queued]
    return [(name, asks) for name, asks in found if asks != Requests()]


def known_requests(template: Template, scope: Scope) -> Requests | None:
    """What one pod of `template` will ask of the node, as far as `scope` tells it; None when it cannot yet."""
    if isinstance(template, ContainerTemplate):
        found = container_asks(template, scope)
        return None if None in found.values() else Requests(found.get("cpu") or 0, found.get("memory") or 0)
    if isinstance(template, ResourceTemplate):
        if "containers" not in template.manifest or _DEPLOYMENT.search(template.manifest):
            return Requests()  # no pod, or a serving pod: it shares the machine as the pod asking does
        asks = resource_asks(template, scope)
        return None if asks is None else asks[0]
    return None if isinstance(template, DagTemplate) else Requests()


def _dependents(run: DagRun, task: str) -> set[str]:
    """The tasks of `run` that depend on `task`, directly or through others."""
    found: set[str] = set()
    grew = True
    while grew:
        grew = False
        for name, other in run.template.tasks.items():
            if name not in found and any(need == task or need in found for need in other.needs()):
                found.add(name)
                grew = True
    return found
