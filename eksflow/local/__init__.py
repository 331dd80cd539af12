"""The local executor: runs a compiled Argo Workflow manifest on this machine (see executor.py and runs.py)."""

from eksflow.local.errors import LocalExecutorError, RunInterrupted
from eksflow.local.executor import run_workflow
from eksflow.local.runs import (
    InputChanges,
    RunSummary,
    RunView,
    changed_inputs,
    follow_log,
    follow_task_log,
    list_runs,
    load_run,
    resubmit_run,
    resume_workflow,
    retry_run,
    task_log,
)
from eksflow.local.status import NodeStatus, NodeType, Phase, RunResult

__all__ = [
    "InputChanges",
    "LocalExecutorError",
    "NodeStatus",
    "NodeType",
    "Phase",
    "RunInterrupted",
    "RunResult",
    "RunSummary",
    "RunView",
    "changed_inputs",
    "follow_log",
    "follow_task_log",
    "list_runs",
    "load_run",
    "resubmit_run",
    "resume_workflow",
    "retry_run",
    "run_workflow",
    "task_log",
]
