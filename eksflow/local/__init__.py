"""The local executor: runs a compiled Argo Workflow manifest on this machine (see executor.py)."""

from eksflow.local.executor import (
    LocalExecutorError,
    NodeStatus,
    RunInterrupted,
    RunResult,
    resume_workflow,
    run_workflow,
)

__all__ = ["LocalExecutorError", "NodeStatus", "RunInterrupted", "RunResult", "resume_workflow", "run_workflow"]
