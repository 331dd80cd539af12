"""Durations and log tails as eksflow shows them: one way, for the local executor's table and the steps' reports.

Standard library only: a step image has it (eksflow.runtime), and so does the SDK.
"""

from __future__ import annotations

from pathlib import Path

LOG_TAIL_LINES = 20
_TAIL_BYTES = 65536  # plenty for 20 lines of a normal log, and a bound on the read of a huge one


def format_duration(seconds: float | None) -> str:
    """`45s`, `3m12s`, `1h02m`: short enough for a table column; empty for None."""
    if seconds is None:
        return ""
    total = int(seconds)
    if total < 60:
        return f"{total}s"
    if total < 3600:
        return f"{total // 60}m{total % 60:02d}s"
    return f"{total // 3600}h{total % 3600 // 60:02d}m"


def log_tail(path: Path | None, lines: int = LOG_TAIL_LINES) -> list[str]:
    """The last `lines` lines of a log (decoded leniently: a process may print any bytes); none if it is missing."""
    if path is None:
        return []
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            f.seek(max(f.tell() - _TAIL_BYTES, 0))
            text = f.read().decode("utf-8", errors="replace")
    except OSError:
        return []
    return text.splitlines()[-lines:]
