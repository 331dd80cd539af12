"""The node table of a run: every node's status, shared by the scheduler and the task threads under one lock.

Every change goes through `set` (or `add`), which rewrites status.json, tells the display and wakes the
scheduler, so what a reader of status.json sees is never behind what the executor knows.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from typing import Any

from eksflow.local.phase import Phase
from eksflow.local.status import NodeStatus, NodeType, now, short


class NodeBook:
    """Nodes by key, in the order they were created; a resumed run's kept nodes are reused by key."""

    def __init__(
        self,
        kept: Mapping[str, NodeStatus] | None = None,
        *,
        on_change: Callable[[NodeStatus | None], None] = lambda node: None,
    ) -> None:
        self.nodes: dict[str, NodeStatus] = {}
        self.kept = dict(kept or {})  # nodes of the run being resumed, by key
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self._on_change = on_change  # writes status.json, updates the display (called under the lock)
        self.version = 0  # counts changes: the scheduler passes again at once after a pass that changed something
        self._quiet = 0  # inside `quietly`: changes are told once, at the end

    @contextlib.contextmanager
    def quietly(self) -> Iterator[None]:
        """Make many changes (a DAG's Pending nodes) and tell them once, at the end."""
        with self.changed:
            self._quiet += 1
            try:
                yield
            finally:
                self._quiet -= 1
                self.version += 1
                self._tell(None)
                self.changed.notify_all()

    def _tell(self, node: NodeStatus | None) -> None:
        if not self._quiet:
            self._on_change(node)

    def __getitem__(self, key: str) -> NodeStatus:
        return self.nodes[key]

    def get(self, key: str) -> NodeStatus | None:
        """The node `key`, if it exists yet."""
        return self.nodes.get(key)

    def keep(self, key: str, parent: str | None) -> bool:
        """Reuse node `key` (and everything under it) from the resumed run if it Succeeded there; whether it did."""
        old = self.kept.get(key)
        if old is None or old.phase is not Phase.SUCCEEDED:
            return False
        with self.lock:
            self._adopt(key)
            self.nodes[key].parent = parent
            if parent is not None and key not in self.nodes[parent].children:
                self.nodes[parent].children.append(key)
            self.version += 1
            self._tell(self.nodes[key])
        return True

    def _adopt(self, key: str) -> None:
        old = self.kept[key]
        self.nodes[key] = replace(old, children=list(old.children))
        for child in old.children:
            if child in self.kept:
                self._adopt(child)

    def add(
        self,
        key: str,
        template: str,
        *,
        node_type: NodeType,
        display_name: str,
        parent: str | None,
        phase: Phase = Phase.PENDING,
        message: str = "",
    ) -> NodeStatus:
        """Create node `key` (replacing a node of that key from an earlier try of its task)."""
        with self.changed:
            node = NodeStatus(
                name=key,
                template=template,
                phase=phase,
                message=short(message),
                type=node_type,
                display_name=display_name,
                parent=parent,
            )
            if phase.fulfilled:
                node.started_at = node.finished_at = now()
            self.nodes[key] = node
            self.version += 1
            if parent is not None and key not in self.nodes[parent].children:
                self.nodes[parent].children.append(key)
            self._tell(node)
            self.changed.notify_all()
            return node

    def set(self, key: str, phase: Phase, message: str = "", **fields: Any) -> None:
        """Move node `key` to `phase` (timestamps follow), with other fields of NodeStatus."""
        with self.changed:
            node = self.nodes[key]
            node.phase = phase
            node.message = short(message)
            for name, value in fields.items():
                setattr(node, name, value)
            if phase is Phase.RUNNING and node.started_at is None:
                node.started_at = now()
            if phase.fulfilled:
                node.started_at = node.started_at or now()
                node.finished_at = now()
            self.version += 1
            self._tell(node)
            self.changed.notify_all()

    def touch(self) -> None:
        """Something not about one node's phase changed (progress): write it out."""
        with self.changed:
            self._tell(None)

    def wake(self) -> None:
        """Something outside the book changed (the node has room again): the scheduler passes again at once."""
        with self.changed:
            self.version += 1
            self.changed.notify_all()

    def running_pods(self) -> int:
        """Pods created and not ended, everywhere in the run (what spec.parallelism limits, as Argo counts them).

        Pending ones count: they wait for room on the node.
        """
        with self.lock:
            return sum(
                n.type is NodeType.POD
                and (n.phase is Phase.RUNNING or (n.phase is Phase.PENDING and n.started_at is not None))
                for n in self.nodes.values()
            )

    def snapshot(self) -> dict[str, NodeStatus]:
        """A copy of every node, safe to hand out."""
        with self.lock:
            return {k: replace(n, children=list(n.children), outputs=dict(n.outputs)) for k, n in self.nodes.items()}
