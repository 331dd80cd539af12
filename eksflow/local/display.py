"""What a local run shows: a live table of task phases on a terminal, one plain line per phase change elsewhere.

Task names, messages, progress and log lines are a step's text: each is shown as rich Text (never markup) through
eksflow.runtime.shown, so a message cannot move the cursor, retitle the terminal or style itself.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from types import TracebackType

from rich.console import Console, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from eksflow.local.phase import Phase
from eksflow.local.status import NodeStatus, NodeType, parse_time
from eksflow.runtime.readable import format_duration, log_tail
from eksflow.runtime.shown import shown

_PHASE_STYLES = {
    Phase.PENDING: "dim",
    Phase.RUNNING: "bold blue",
    Phase.SUCCEEDED: "green",
    Phase.FAILED: "bold red",
    Phase.ERROR: "bold red",
    Phase.SKIPPED: "yellow",
    Phase.OMITTED: "dim yellow",
}
_SHOWN_MESSAGE_CHARS = 160
CACHED = "cached"  # how a memoized node (outputs from the cache, nothing ran) is marked


def node_duration(node: NodeStatus) -> str:
    """How long the node has run (until now while it runs); empty if it never started."""
    start = parse_time(node.started_at)
    if start is None:
        return ""
    end = parse_time(node.finished_at) or datetime.now(timezone.utc)
    return format_duration(max((end - start).total_seconds(), 0.0))


def _short(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= _SHOWN_MESSAGE_CHARS else line[: _SHOWN_MESSAGE_CHARS - 3] + "..."


def in_tree_order(nodes: Sequence[NodeStatus]) -> list[tuple[int, NodeStatus]]:
    """(depth, node): each node followed by its children (fan-out iterations, a nested DAG's tasks)."""
    by_key = {node.name: node for node in nodes}
    ordered: list[tuple[int, NodeStatus]] = []

    def visit(node: NodeStatus, depth: int) -> None:
        ordered.append((depth, node))
        for child in node.children:
            if child in by_key:
                visit(by_key[child], depth + 1)

    for node in nodes:
        if node.parent is None or node.parent not in by_key:
            visit(node, 0)
    return ordered


def progress_text(node: NodeStatus, nodes: dict[str, NodeStatus]) -> str:
    """The progress column: a step's own N/M, or how many iterations of a fan-out are done."""
    if node.type is NodeType.TASK_GROUP and node.children:
        done = sum(nodes[c].phase.fulfilled for c in node.children if c in nodes)
        return f"{done}/{len(node.children)} done"
    return node.progress or ""


def message_text(node: NodeStatus) -> str:
    """The message column: the node's message, or `cached` for a memoized node."""
    if node.cached:
        return f"{CACHED}: {node.message}" if node.message else CACHED
    return node.message


class TaskDisplay:
    """Shows task phases while a workflow runs. Use as a context manager around the run."""

    def __init__(self, console: Console | None, nodes: Callable[[], Sequence[NodeStatus]]) -> None:
        self.console = console if console is not None else Console()
        self._nodes = nodes
        self._live: Live | None = None

    def __enter__(self) -> TaskDisplay:
        if self.console.is_terminal:
            self._live = Live(
                console=self.console, refresh_per_second=2, get_renderable=self._table, redirect_stderr=False
            )
            self._live.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._live is not None:
            self._live.refresh()
            self._live.stop()
            self._live = None

    def _table(self) -> RenderableType:
        table = Table(box=None, pad_edge=False, header_style="bold")
        for column in ("task", "phase", "progress", "duration", "retries", "message"):
            table.add_column(column, no_wrap=column != "message")
        nodes = list(self._nodes())
        by_key = {node.name: node for node in nodes}
        for depth, node in in_tree_order(nodes):
            table.add_row(
                Text("  " * depth + shown(node.display_name)),
                Text(str(node.phase), style=_PHASE_STYLES.get(node.phase, "")),
                Text(shown(progress_text(node, by_key))),
                node_duration(node),
                str(node.retries) if node.retries else "",
                Text(shown(_short(message_text(node)))),
            )
        return table

    def phase_changed(self, node: NodeStatus) -> None:
        """Print one line for the new phase (plain mode), and the log tail when the task failed."""
        if self._live is None:
            line = f"  {node.name:<18} {node.phase}"
            if node.finished_at and node.started_at:
                line += f"  ({node_duration(node)})"
            message = message_text(node)
            if message:
                line += f"  {_short(message)}"
            self._print(line)
        if node.phase.failed_or_error and node.log is not None:
            tail = log_tail(node.log)
            if tail:
                self._print(f"--- last {len(tail)} lines of {node.log} ---")
                for text in tail:
                    self._print(text, style="dim")

    def note(self, text: str) -> None:
        """Print a line that is not about one task (workflow start and end)."""
        self._print(text)

    def _print(self, line: str, style: str = "") -> None:
        # After SIGHUP the terminal may be gone; the run must still stop cleanly and record its status.
        with contextlib.suppress(OSError):
            self.console.print(Text(shown(line), style=style), highlight=False, soft_wrap=True)
