"""The local run folder a task can read, and the report a project may leave in it.

The local executor sets `$EKSFLOW_RUN_DIR` for every task it starts: the host folder of the run
(`.eksflow/runs/<workflow name>/`) holding `manifest.yaml` (the Workflow as compiled) and `status.json` (its
Argo-like status, rewritten on every phase change). In a cluster the variable is unset: there the Workflow object
is read from the Kubernetes API instead. A task that writes `report.html` into that folder gets its host path
printed at the end of the run (`report_path`).
"""

from __future__ import annotations

import os
from pathlib import Path

RUN_DIR_ENV = "EKSFLOW_RUN_DIR"
MANIFEST_FILE = "manifest.yaml"
STATUS_FILE = "status.json"
REPORT_FILE = "report.html"


def local_run_dir() -> Path | None:
    """The run folder of the local run this task belongs to, or None outside the local executor."""
    value = os.environ.get(RUN_DIR_ENV, "")
    return Path(value) if value else None


def report_path(run_dir: Path) -> Path | None:
    """The host path of the run's HTML report (`<run folder>/report.html`), or None when no task wrote one."""
    path = run_dir / REPORT_FILE
    return path if path.is_file() else None
