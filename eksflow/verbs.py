"""The verbs users know from `argo`: list, get, logs, retry, resubmit, on local runs or on an Argo Server.

    python pipelines/llama_lora.py list                      # this pipeline's runs: phase, start, duration
    python pipelines/llama_lora.py get llama-lora-x7k2p      # tasks, phases, outputs (host paths locally)
    python pipelines/llama_lora.py logs llama-lora-x7k2p train --follow
    python pipelines/llama_lora.py retry llama-lora-x7k2p -p base_model=/models/other
    python pipelines/llama_lora.py resubmit llama-lora-x7k2p

Local runs (in --state-dir) by default; the Argo Server's when ARGO_SERVER is set (or --argo-server is given),
with the argo CLI's connection settings. Bad input exits 2, a run that fails exits 1, one line each; a run or
task that is not there is "not found" (exit 2). A run name is a workflow name (eksflow.names), never a path. The
local read verbs (list, get, logs) write nothing. Everything printed from a run or a server's answer (names,
messages, outputs, log lines) goes through eksflow.runtime.shown: no terminal escapes, no rich markup, no token.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterable
from datetime import datetime, timezone
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from eksflow.errors import EXIT_FAILED, ConfigError
from eksflow.runtime.shown import shown
from eksflow.submit import add_connection_options

VERBS = ("list", "get", "logs", "retry", "resubmit")


def add_verbs(commands: argparse._SubParsersAction[argparse.ArgumentParser], state_dir: Path) -> None:
    """The verbs' sub-commands, each with --state-dir (local) and the Argo Server's connection flags."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--state-dir", type=Path, default=state_dir, help="where local runs live (default .eksflow)")
    add_connection_options(common)
    listed = commands.add_parser("list", parents=[common], help="runs of this pipeline: phase, start, duration")
    listed.add_argument("--all", action="store_true", help="every pipeline's runs, not only this one's")
    get = commands.add_parser("get", parents=[common], help="one run: its tasks, phases and outputs")
    get.add_argument("name", help="the run (workflow) name")
    logs = commands.add_parser("logs", parents=[common], help="a run's log, or one task's")
    logs.add_argument("name", help="the run (workflow) name")
    logs.add_argument("task", nargs="?", help="one task (default: every task, in start order)")
    logs.add_argument("-f", "--follow", action="store_true", help="keep printing until the task (or run) ends")
    for verb, what in (("retry", "re-run its failed tasks"), ("resubmit", "a new run of the same workflow")):
        command = commands.add_parser(verb, parents=[common], help=what + ", parameters overridden with -p")
        command.add_argument("name", help="the run (workflow) name")
        command.add_argument(
            "-p",
            "--parameter",
            dest="parameters",
            action="append",
            default=[],
            metavar="NAME=VALUE",
            help="override a workflow parameter (repeatable), like `argo retry -p`",
        )


def remote(args: argparse.Namespace) -> bool:
    """Whether the verbs talk to an Argo Server rather than local runs."""
    return bool(args.argo_server or os.environ.get("ARGO_SERVER"))


def run_verb(args: argparse.Namespace, pipeline: str, root: Path, console: Console) -> int:
    """Run one verb; the errors eksflow raises on purpose (EksflowError) propagate to the CLI's `main`."""
    from eksflow.argo_server import parse_parameters

    parameters = parse_parameters(getattr(args, "parameters", []))
    if remote(args):
        return _remote(args, pipeline, parameters, console)
    return _local(args, pipeline, parameters, root, console)


def _local(args: argparse.Namespace, pipeline: str, parameters: dict[str, str], root: Path, console: Console) -> int:
    from eksflow import local
    from eksflow.local.runs import run_folder
    from eksflow.local.trainer_status_server import trainer_status_line
    from eksflow.parameters import parameter_problems
    from eksflow.run import execute_env, print_result

    if args.command == "list":
        runs = [r for r in local.list_runs(args.state_dir) if args.all or r.pipeline == pipeline]
        _table(
            console,
            ["run", "phase", "started", "duration", "message"],
            ([r.name, str(r.phase), _when(r.started_at), _seconds(r.duration_s), r.message] for r in runs),
        )
        return 0
    if args.command == "get":
        out = Console(soft_wrap=True)  # the answer goes to stdout, like `argo get`
        view = local.load_run(args.state_dir, args.name)
        out.print(
            f"[bold]{escape(shown(view.name))}[/bold] {view.phase}"
            + (f": {escape(shown(view.message))}" if view.message else ""),
            highlight=False,
        )
        out.print(shown(f"run folder: {view.run_dir}"), markup=False, highlight=False, soft_wrap=True)
        for key, node in view.nodes.items():
            duration = _seconds(_span(node.started_at, node.finished_at))
            cached = " (memoized)" if node.memoization is not None and node.memoization.hit else ""
            placed = f"  on {node.host_node}" if node.host_node else ""  # with simulated nodes (`run --nodes`)
            line = f"  {local.node_label(view, key)}  {node.phase}  {duration}{cached}{placed}" + (
                f"  {node.message}" if node.message else ""
            )
            out.print(shown(line), markup=False, highlight=False, soft_wrap=True)
            for pod in node.pods:
                pod_line = f"      pod {pod['name']} ({pod['role']}) on {pod['hostNodeName']}, {pod['podIP']}"
                out.print(shown(pod_line), markup=False, highlight=False, soft_wrap=True)
            if node.trainer_status is not None:  # a TrainJob's, as `kubectl get trainjob` shows status.trainerStatus
                line = f"      trainerStatus: {trainer_status_line(node.trainer_status)}"
                out.print(shown(line), markup=False, highlight=False, soft_wrap=True)
            for name, value in view.host_outputs(key).items():
                out.print(shown(f"      {name} = {_short(value)}"), markup=False, highlight=False, soft_wrap=True)
        return 0 if view.phase is local.Phase.SUCCEEDED else EXIT_FAILED
    if args.command == "logs":
        return _local_logs(args, console)
    settings: local.HowToRun = {"cwd": root, "env": execute_env(root), "console": console}
    saved, _ = run_folder(args.state_dir, args.name).read()
    if problems := parameter_problems(saved, parameters):  # checked before a new run starts, as `run` is
        raise ConfigError("\n".join(problems))
    if args.command == "retry":
        result = local.retry_run(args.state_dir, args.name, parameters, **settings)
    else:
        result = local.resubmit_run(args.state_dir, args.name, parameters, **settings)
    return print_result(result, console)


def _local_logs(args: argparse.Namespace, console: Console) -> int:
    from eksflow import local

    view = local.load_run(args.state_dir, args.name)
    keys = local.find_nodes(view, args.task) if args.task else [k for k, n in view.nodes.items() if n.log is not None]
    for key in keys:  # a fanned-out task: every iteration's log, each line labelled with its item
        path = local.task_log(args.state_dir, args.name, key)
        lines: Iterable[str]
        if args.follow:
            lines = local.follow_task_log(args.state_dir, args.name, key)
        else:
            lines = path.read_text(errors="replace").splitlines() if path.is_file() else []
        prefix = f"{local.node_label(view, key)}: " if len(keys) > 1 or not args.task else ""
        for line in lines:
            sys.stdout.write(shown(f"{prefix}{line}") + "\n")
            sys.stdout.flush()
    return 0


def _remote(args: argparse.Namespace, pipeline: str, parameters: dict[str, str], console: Console) -> int:
    from eksflow import argo_server
    from eksflow.argo_client import ArgoServer
    from eksflow.parameters import parameter_problems

    server = ArgoServer.from_options(args)
    if args.command == "list":
        runs = argo_server.list_workflows(server, pipeline=None if args.all else pipeline)
        _table(
            console,
            ["run", "phase", "started", "duration", "message"],
            ([r.name, r.phase, _when(r.started), _seconds(r.duration_s), r.message] for r in runs),
        )
        return 0
    if args.command == "get":
        out = Console(soft_wrap=True)  # the answer goes to stdout, like `argo get`
        detail = argo_server.get_workflow(server, args.name)
        out.print(
            f"[bold]{escape(shown(detail.summary.name))}[/bold] {escape(shown(detail.summary.phase))}",
            highlight=False,
        )
        for task in detail.tasks:
            line = f"  {task.name}  {task.phase}  {_seconds(_span(task.started, task.finished))}" + (
                f"  {task.message}" if task.message else ""
            )
            out.print(shown(line), markup=False, highlight=False, soft_wrap=True)
            for name, value in task.outputs.items():
                out.print(shown(f"      {name} = {_short(value)}"), markup=False, highlight=False, soft_wrap=True)
        return 0 if detail.summary.phase == "Succeeded" else EXIT_FAILED
    if args.command == "logs":
        for entry in argo_server.workflow_logs(server, args.name, args.task, follow=args.follow):
            sys.stdout.write(shown(f"{entry.task}: {entry.content}" if not args.task else entry.content) + "\n")
            sys.stdout.flush()
        return 0
    if parameters:  # checked before the server starts anything, as for a local run
        workflow = argo_server.workflow_manifest(server, args.name)
        if problems := parameter_problems(workflow, parameters):
            raise ConfigError("\n".join(problems))
    if args.command == "retry":
        argo_server.retry_workflow(server, args.name, parameters)
    else:
        argo_server.resubmit_workflow(server, args.name, parameters)
    console.print(shown(f"{args.command}: {args.name} sent to {server.url}"), markup=False, highlight=False)
    return 0


def _table(console: Console, header: list[str], rows: Iterable[list[str]]) -> None:
    """A table on stdout; piped, one line per row (no wrapping), so scripts can read it."""
    table = Table(*header, box=None, pad_edge=False)
    for column in table.columns:
        column.no_wrap = True
    for row in rows:
        table.add_row(*(Text(shown(cell)) for cell in row))
    out = Console()
    if not out.is_terminal:
        out = Console(width=1000)
    out.print(table)


def _span(started: object, finished: object) -> float | None:
    start, end = _time(started), _time(finished)
    if start is None:
        return None
    return max(((end or datetime.now(timezone.utc)) - start).total_seconds(), 0.0)


def _time(value: object) -> datetime | None:
    if isinstance(value, datetime):
        return value
    if isinstance(value, str) and value:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    return None


def _when(value: object) -> str:
    moment = _time(value)
    return moment.strftime("%Y-%m-%d %H:%M:%S") if moment else "-"


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    minutes, seconds = divmod(int(value), 60)
    return f"{minutes}m{seconds:02d}s" if minutes else f"{seconds}s"


def _short(value: str, limit: int = 160) -> str:
    return value if len(value) <= limit else value[: limit - 3] + "..."
