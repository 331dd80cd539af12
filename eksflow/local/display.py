"""What a local run shows: a live table of task phases on a terminal, one plain line per phase change elsewhere."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

from rich.console import Console, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:
    from eksflow.local.executor import NodeStatus

LOG_TAIL_LINES = 20
_PHASE_STYLES = {
    "Pending": "dim",
    "Running": "bold blue",
    "Succeeded": "green",
    "Failed": "bold red",
    "Error": "bold red",
    "Skipped": "yellow",
    "Omitted": "dim yellow",
}
_SHOWN_MESSAGE_CHARS = 160


def _parse_time(stamp: str | None) -> datetime | None:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")) if stamp else None


def format_duration(seconds: float) -> str:
    """`45s`, `3m12s`, `1h02m`: short enough for a table column."""
    total = int(seconds)
    if total < 60:
        return f"{total}s"
    if total < 3600:
        return f"{total // 60}m{total % 60:02d}s"
    return f"{total // 3600}h{total % 3600 // 60:02d}m"


def node_duration(node: NodeStatus) -> str:
    """How long the node has run (until now while it runs); empty if it never started."""
    start = _parse_time(node.started_at)
    if start is None:
        return ""
    end = _parse_time(node.finished_at) or datetime.now(timezone.utc)
    return format_duration(max((end - start).total_seconds(), 0.0))


def _short(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= _SHOWN_MESSAGE_CHARS else line[: _SHOWN_MESSAGE_CHARS - 3] + "..."


def log_tail(path: Path | None, lines: int = LOG_TAIL_LINES) -> list[str]:
    """The last `lines` lines of a task log (decoded leniently: a step may print any bytes)."""
    if path is None or not path.exists():
        return []
    with open(path, "rb") as f:
        f.seek(0, 2)
        # 64 KiB is plenty for 20 lines of a normal log, and bounds the read for a huge one.
        f.seek(max(f.tell() - 65536, 0))
        text = f.read().decode("utf-8", errors="replace")
    return text.splitlines()[-lines:]


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
        for node in self._nodes():
            table.add_row(
                node.name,
                Text(node.phase, style=_PHASE_STYLES.get(node.phase, "")),
                node.progress or "",
                node_duration(node),
                str(node.retries) if node.retries else "",
                Text(_short(node.message)),
            )
        return table

    def phase_changed(self, node: NodeStatus) -> None:
        """Print one line for the new phase (plain mode), and the log tail when the task failed."""
        if self._live is None:
            line = f"  {node.name:<18} {node.phase}"
            if node.finished_at and node.started_at:
                line += f"  ({node_duration(node)})"
            if node.message:
                line += f"  {_short(node.message)}"
            self.console.print(line, markup=False, highlight=False, soft_wrap=True)
        if node.phase in ("Failed", "Error") and node.log is not None:
            tail = log_tail(node.log)
            if tail:
                self.console.print(f"--- last {len(tail)} lines of {node.log} ---", markup=False, highlight=False)
                for text in tail:
                    self.console.print(Text(text, style="dim"), soft_wrap=True)

    def note(self, text: str) -> None:
        """Print a line that is not about one task (workflow start and end)."""
        self.console.print(text, markup=False, highlight=False, soft_wrap=True)
