"""This machine as the one node of a cluster: a pod starts when its CPU and memory requests fit beside the others.

The manifest says what each pod requests (`resources.requests`, or its limits when it gives no requests, as
Kubernetes defaults them); a cluster's scheduler places a pod on a node only where the requests of the pods already
there leave room for it, and leaves it Pending with the reason otherwise. The local executor does the same on a
node the size of this machine (its usable cores and memory: `machine`), with four rules a one-node stand-in needs:

- A pod asking for more than the whole machine (vLLM's 14 CPUs and 48Gi, sized for an m6i.4xlarge) is counted as
  asking for the whole machine: it runs here alone, where a cluster would give it a node of its size.
- Pods that end (tasks) are placed before pods that stay (a Deployment's, which hold their share until the run
  ends): the engine never halves a training, as it would not on its own inference node.
- A pod that does not fit beside pods that stay only (the serving fleet) starts anyway, sharing the machine: on a
  cluster it would get a node of its own, and waiting here would wait for the end of the run.
- A pod that stays starts sharing the machine beside tasks too, once those tasks and every task that may still start
  before it or beside it (`ahead`: the scheduler knows them from the DAG) leave a core free: the engine then loads
  beside the evaluation, which decodes on one core, never beside or before training, which asks for every core.
  Memory is not counted there (the engine asks for 48Gi), as it is not when a pod shares beside the fleet.

Decisions are taken on the scheduler's thread once per pass (`schedule`), after it has started every task that can
start, so a Deployment never slips in between one task's end and the start of the task that follows it.
"""

from __future__ import annotations

import math
import os
import re
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

import yaml

from eksflow.errors import EXIT_BAD_INPUT, EksflowError
from eksflow.local.model import ContainerTemplate, ResourceTemplate, Template
from eksflow.local.substitution import Scope, UnresolvedError

_QUANTITY = re.compile(r"([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?")
_SUFFIX = {
    "": Decimal(1), "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "k": Decimal(10) ** 3,
    "M": Decimal(10) ** 6, "G": Decimal(10) ** 9, "T": Decimal(10) ** 12, "P": Decimal(10) ** 15,
    "E": Decimal(10) ** 18, "Ki": Decimal(2) ** 10, "Mi": Decimal(2) ** 20, "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40, "Pi": Decimal(2) ** 50, "Ei": Decimal(2) ** 60,
}  # fmt: skip
_WAIT_S = 0.5  # how often a waiting pod checks whether the run is stopping
_CORE_M = 1000  # what a serving pod needs left free to load beside tasks: one core

# A task that may still start before or beside a pod, and what it will ask of the node (None: not known before it
# starts, so counted as asking for every core).
Ahead = tuple[str, "Requests | None"]


class QuantityError(EksflowError, ValueError):
    """A resource quantity Kubernetes would refuse; the message names it."""

    label = "quantity error"
    exit_code = EXIT_BAD_INPUT


@dataclass(frozen=True)
class Requests:
    """What a pod asks of a node: CPU in millicores, memory in bytes."""

    cpu_m: int = 0
    memory: int = 0

    def __add__(self, other: Requests) -> Requests:
        return Requests(self.cpu_m + other.cpu_m, self.memory + other.memory)

    def __sub__(self, other: Requests) -> Requests:
        return Requests(self.cpu_m - other.cpu_m, self.memory - other.memory)

    def times(self, n: int) -> Requests:
        """The requests of `n` such pods."""
        return Requests(self.cpu_m * n, self.memory * n)

    def within(self, capacity: Requests) -> Requests:
        """These requests, none larger than `capacity` (the whole machine)."""
        return Requests(min(self.cpu_m, capacity.cpu_m), min(self.memory, capacity.memory))

    def short_of(self, free: Requests) -> list[str]:
        """The resources `free` has too little of for these requests ([] when they fit).

        As Kubernetes' scheduler checks them: only what the pod requests, so a pod asking nothing fits a node that
        pods sharing it have overcommitted.
        """
        pairs = (("cpu", self.cpu_m, free.cpu_m), ("memory", self.memory, free.memory))
        return [name for name, need, have in pairs if need > 0 and need > have]

    def __str__(self) -> str:
        return f"cpu {cpu_text(self.cpu_m)}, memory {memory_text(self.memory)}"


def cpu_text(cpu_m: int) -> str:
    """Millicores as Kubernetes writes them: 2, 500m."""
    return f"{cpu_m // 1000}" if cpu_m % 1000 == 0 else f"{cpu_m}m"


def memory_text(memory: int) -> str:
    """Bytes in the largest binary unit that holds them: 12Gi, 512Mi."""
    for unit, size in (("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
        if memory >= size:
            return f"{memory / size:.3g}{unit}"
    return str(memory)


def quantity(value: object, resource: str) -> int:
    """A Kubernetes quantity as millicores (`cpu`) or bytes (`memory`), rounded up as the API server does."""
    text = str(value).strip()
    match = _QUANTITY.fullmatch(text)
    if match is None or isinstance(value, bool):
        raise QuantityError(f"{resource} quantity {text!r} is not a Kubernetes quantity (e.g. 2, 500m, 12Gi)")
    try:
        amount = Decimal(match.group(1)) * _SUFFIX[match.group(2) or ""]
    except InvalidOperation:
        raise QuantityError(f"{resource} quantity {text!r} is not a number") from None
    if amount < 0:
        raise QuantityError(f"{resource} quantity {text!r} is negative")
    return math.ceil(amount * 1000) if resource == "cpu" else math.ceil(amount)


def container_requests(resources: Mapping[str, Any] | None) -> Requests:
    """A container's requests: `requests`, each missing one taken from `limits` (Kubernetes' defaulting)."""
    resources = resources or {}
    requests = resources.get("requests") or {}
    limits = resources.get("limits") or {}
    found = {name: requests.get(name, limits.get(name)) for name in ("cpu", "memory")}
    return Requests(*(quantity(found[name], name) if found[name] is not None else 0 for name in ("cpu", "memory")))


def pod_requests(manifest: Mapping[str, Any]) -> Requests:
    """What the pods an object creates request together: every pod template in it times its `replicas`.

    One walk serves every kind eksflow runs (a Deployment's spec.template, a RayJob's head and worker groups, an
    MPIJob's launcher and workers, a Volcano Job's tasks): a pod template is a `template` with a `spec.containers`.
    A TrainJob's trainer pods are no template of its own: `spec.trainer.resourcesPerNode` times `numNodes`.
    """
    total = Requests()
    spec = manifest.get("spec")
    trainer = spec.get("trainer") if manifest.get("kind") == "TrainJob" and isinstance(spec, Mapping) else None
    if isinstance(trainer, Mapping):
        nodes = trainer.get("numNodes", 1)
        per_node = container_requests(trainer.get("resourcesPerNode"))
        total += per_node.times(nodes if isinstance(nodes, int) and nodes >= 0 else 1)
    for owner in _pod_template_owners(manifest):
        spec = owner["template"]["spec"]
        per_pod = sum((container_requests(c.get("resources")) for c in spec["containers"]), Requests())
        replicas = owner.get("replicas", 1)
        total += per_pod.times(replicas if isinstance(replicas, int) and replicas >= 0 else 1)
    return total


def _pod_template_owners(value: object) -> Iterable[Mapping[str, Any]]:
    if isinstance(value, Mapping):
        template = value.get("template")
        spec = template.get("spec") if isinstance(template, Mapping) else None
        if isinstance(spec, Mapping) and isinstance(spec.get("containers"), list):
            yield value
            return
        for item in value.values():
            yield from _pod_template_owners(item)
    elif isinstance(value, list):
        for item in value:
            yield from _pod_template_owners(item)


def machine() -> Requests:
    """This machine's usable cores and memory: its CPU affinity and RAM, within its cgroup's limits."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    quota, limit = _cgroup_limits(Path("/sys/fs/cgroup"))
    cpu_m = cpus * 1000 if quota is None else min(cpus * 1000, quota)
    return Requests(cpu_m, memory if limit is None else min(memory, limit))


def _cgroup_limits(root: Path) -> tuple[int | None, int | None]:
    """The cgroup (v2) cpu.max (as millicores) and memory.max (bytes); None where unlimited or unreadable."""
    quota = limit = None
    try:
        max_quota, period = (root / "cpu.max").read_text().split()
        if max_quota != "max":
            quota = max(1, int(int(max_quota) * 1000 / int(period)))
    except (OSError, ValueError):
        pass
    try:
        text = (root / "memory.max").read_text().strip()
        limit = None if text == "max" else int(text)
    except (OSError, ValueError):
        pass
    return quota, limit


@dataclass
class Ticket:
    """One pod's place on the node: waiting until `granted`, then holding its requests until released."""

    holder: str  # the node key of the task that owns the pod
    asked: Requests  # as the manifest says
    requests: Requests  # as counted here (within the machine)
    lasting: bool  # a Deployment's pod: it stays until the run ends
    granted: threading.Event = field(default_factory=threading.Event)
    reason: str = ""  # why it waits (the Pending node's message), or how it was placed
    # started with too little room (beside the fleet, or a serving pod beside tasks): on a cluster, a node of its own
    shared: bool = False


class Node:
    """The node's bookkeeping: tickets waiting and holding, granted once per scheduler pass (`schedule`)."""

    def __init__(
        self,
        capacity: Requests,
        *,
        on_release: Callable[[], None] = lambda: None,
        ahead: Callable[[str], Sequence[Ahead]] = lambda holder: (),
    ) -> None:
        self.capacity = capacity
        self._on_release = on_release  # wakes the scheduler: a pod waiting may fit now
        self._ahead = ahead  # the tasks that may still start before or beside a pod (called on the scheduler's thread)
        self._lock = threading.Lock()
        self._waiting: list[Ticket] = []
        self._holding: dict[str, Ticket] = {}

    def request(self, holder: str, asked: Requests, *, lasting: bool) -> Ticket:
        """Queue a pod for the node; the next `schedule` pass decides."""
        ticket = Ticket(holder, asked, asked.within(self.capacity), lasting)
        with self._lock:
            self._waiting.append(ticket)
        return ticket

    def schedule(self) -> None:
        """Grant what fits, tasks first (see the module docstring); leave each other ticket its reason."""
        with self._lock:
            tasks = [t for t in self._waiting if not t.lasting]
            for ticket in tasks or [t for t in self._waiting if t.lasting]:
                free = self.capacity - sum((t.requests for t in self._holding.values()), Requests())
                short = ticket.requests.short_of(free)
                if short:
                    waits_for = self._waits_for(ticket, short)
                    if waits_for:
                        ticket.reason = waits_for
                        continue
                    ticket.shared = True
                    beside = [t.holder for t in self._tasks_holding()]
                    ticket.reason = (
                        f"loads beside {', '.join(beside)} on the core they leave free"
                        if beside
                        else f"shares this machine with the serving fleet (requests {ticket.requests})"
                    ) + ": on a cluster it gets a node of its own"
                else:
                    ticket.shared, ticket.reason = False, ""
                self._waiting.remove(ticket)
                self._holding[ticket.holder] = ticket
                ticket.granted.set()
            if tasks:
                for ticket in self._waiting:
                    if ticket.lasting:
                        ticket.reason = (
                            "waits for the tasks ahead of it: a serving pod holds its share of the node until the "
                            "run ends"
                        )

    def _waits_for(self, ticket: Ticket, short: list[str]) -> str:
        """Why `ticket`, which does not fit, waits (its Pending reason); "" when it starts anyway, sharing."""
        tasks = self._tasks_holding()
        if not tasks:
            return ""  # beside the serving fleet only (and pods asking nothing)
        if ticket.lasting:
            held = sum(t.requests.cpu_m for t in tasks)
            crowding = [f"{t.holder} (holds {t.requests})" for t in tasks] if not self._leaves_a_core(held) else []
            for name, asks in self._ahead(ticket.holder):
                if asks is None or not self._leaves_a_core(asks.cpu_m):
                    crowding.append(f"{name} (ahead, asks {'what is not known yet' if asks is None else asks})")
            if not crowding:
                return ""
            return (
                f"waits for tasks that leave no core free: {', '.join(crowding)}; a serving pod holds its share of "
                "the node until the run ends"
            )
        holders = ", ".join(f"{t.holder} ({t.requests})" for t in tasks)
        return (
            f"0/1 nodes are available: Insufficient {', '.join(short)} (requests {ticket.requests} of this machine's "
            f"{self.capacity}; held by {holders})"
        )

    def _tasks_holding(self) -> list[Ticket]:
        """The tasks holding a share of the node (a pod asking nothing crowds no one)."""
        return [t for t in self._holding.values() if not t.lasting and t.requests != Requests()]

    def _leaves_a_core(self, cpu_m: int) -> bool:
        return cpu_m + _CORE_M <= self.capacity.cpu_m

    def wait(self, ticket: Ticket, stop_reason: Callable[[], str], on_pending: Callable[[str], None]) -> bool:
        """Block until `ticket` is granted (True) or the run stops (False, the ticket withdrawn)."""
        shown = None
        while not ticket.granted.wait(_WAIT_S):
            if stop_reason():
                self.release(ticket)
                return False
            if ticket.reason and ticket.reason != shown:
                shown = ticket.reason
                on_pending(shown)
        return True

    def release(self, ticket: Ticket) -> None:
        """Give back what `ticket` holds, or withdraw it if it still waits."""
        with self._lock:
            if ticket in self._waiting:
                self._waiting.remove(ticket)
            if self._holding.get(ticket.holder) is ticket:
                del self._holding[ticket.holder]
        self._on_release()

    def holding(self) -> list[Ticket]:
        """The tickets granted and not yet released."""
        with self._lock:
            return list(self._holding.values())


def template_requests(template: Template, scope: Scope) -> tuple[Requests, bool]:
    """What one attempt of `template`'s pod asks of the node, and whether it stays (a Deployment's pod).

    A container template asks its container's requests; a resource template what the pods of its object ask
    (Argo's own resource pod asks nothing). A request that cannot be read asks nothing: the attempt itself then
    fails with the reason (the API server would refuse the object).
    """
    if isinstance(template, ContainerTemplate):
        found = container_asks(template, scope)
        return Requests(found.get("cpu") or 0, found.get("memory") or 0), False
    if isinstance(template, ResourceTemplate):
        return resource_asks(template, scope) or (Requests(), False)
    return Requests(), False


def container_asks(template: ContainerTemplate, scope: Scope) -> dict[str, int | None]:
    """Each request of the container (cpu, memory) as read with `scope`; None where it cannot be read."""
    found: dict[str, int | None] = {}
    for name, value in template.requests:
        try:
            found[name] = quantity(scope.substitute(value), name)
        except (UnresolvedError, QuantityError):
            found[name] = None
    return found


def resource_asks(template: ResourceTemplate, scope: Scope) -> tuple[Requests, bool] | None:
    """What the pods of the resource's object ask, and whether it is a Deployment; None if `scope` cannot read it."""
    try:
        manifest = yaml.safe_load(scope.substitute(template.manifest))
        if isinstance(manifest, Mapping):
            return pod_requests(manifest), manifest.get("kind") == "Deployment"
    except (UnresolvedError, QuantityError, yaml.YAMLError):
        pass
    return None
