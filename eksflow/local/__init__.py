"""The local executor: runs a compiled Argo Workflow manifest on this machine, task by task, as local processes.

    run_workflow(manifest, state_dir, cwd=, env=, console=, parameters=, memoize=True) -> RunResult
    resume_workflow(run_dir, cwd=, env=, console=, parameters=, manifest=, memoize=True) -> RunResult
    retry_run(state_dir, name, parameters, **HowToRun) / resubmit_run(state_dir, name, parameters, **HowToRun)
    list_runs(state_dir) -> [RunSummary]; load_run(state_dir, name) -> RunView
    task_log(state_dir, name, task) -> Path; follow_task_log(...) / follow_log(path, done=) -> lines
    find_nodes(view, task) -> [node key] (every iteration of a fanned-out task); node_label(view, key)
    changed_inputs(saved_manifest, saved_parameters, manifest, parameters) -> InputChanges
    register_run_service(kinds, factory, check=) (a RunService per run for objects of `kinds`; RunServiceError)

What a run service uses to run its objects' containers as a cluster would (the LLM layer's serving fleet does):
    PathMap, PathRules, map_argv, map_env   container paths in argv and env mapped to the run's folders
    ProcessTracker                         tell the run's watchdog of each process started (stopped if it dies)
    Requests, container_requests           a container's CPU and memory requests
    NodesContext, SimulatedCluster, PlacedPod, PodNetworkError
                                           the run's simulated nodes (`run --nodes N`): place pods, enter them
    ServiceProxy                           a Service's address on the simulated nodes (what kube-proxy does)

RunResult.resumable says whether to suggest `--resume` (not after a bad-input failure, exit 2); RunInterrupted
(Ctrl-C, SIGTERM, SIGHUP) carries `exit_code` (128 + signal). RunNotFoundError ("not found") names a run or task
that is not there; StateWriteError, a state folder that cannot be written (a run is refused before it starts).
Modules: executor.py (driving a run), runs.py (the verbs), manifest.py/model.py (what a manifest may hold),
scheduler.py, handlers.py, process.py, status.py, services.py (run services: objects a run applies whose processes
live as long as the run; register_run_service(kinds, factory) adds one, e.g. the LLM layer's serving fleet:
eksflow/llm/serving/local_fleet.py).
"""

from eksflow.local.errors import LocalExecutorError, RunInterrupted, RunNotFoundError, StateWriteError
from eksflow.local.executor import run_workflow
from eksflow.local.handlers import NodesContext
from eksflow.local.model import PathRules
from eksflow.local.node import Requests, container_requests
from eksflow.local.paths import PathMap, map_argv, map_env
from eksflow.local.phase import Phase
from eksflow.local.pod_network import PodNetworkError
from eksflow.local.process import ProcessTracker
from eksflow.local.runs import (
    HowToRun,
    InputChanges,
    RunSummary,
    RunView,
    changed_inputs,
    find_nodes,
    follow_log,
    follow_task_log,
    list_runs,
    load_run,
    node_label,
    resubmit_run,
    resume_workflow,
    retry_run,
    task_log,
)
from eksflow.local.service_proxy import ServiceProxy
from eksflow.local.services import RunService, RunServiceError, register_run_service
from eksflow.local.sim_nodes import PlacedPod, SimulatedCluster
from eksflow.local.status import NodeStatus, NodeType, RunResult

__all__ = [
    "HowToRun",
    "InputChanges",
    "LocalExecutorError",
    "NodeStatus",
    "NodeType",
    "NodesContext",
    "PathMap",
    "PathRules",
    "Phase",
    "PlacedPod",
    "PodNetworkError",
    "ProcessTracker",
    "Requests",
    "RunInterrupted",
    "RunNotFoundError",
    "RunResult",
    "RunService",
    "RunServiceError",
    "RunSummary",
    "RunView",
    "ServiceProxy",
    "SimulatedCluster",
    "StateWriteError",
    "changed_inputs",
    "container_requests",
    "find_nodes",
    "follow_log",
    "follow_task_log",
    "list_runs",
    "load_run",
    "map_argv",
    "map_env",
    "node_label",
    "register_run_service",
    "resubmit_run",
    "resume_workflow",
    "retry_run",
    "run_workflow",
    "task_log",
]
