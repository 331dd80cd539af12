"""`run`: the pipeline's manifest on this machine, through the local executor, in the pipeline's own project.

Local tasks run in the project that holds the pipeline (its folder is their working directory and is on their
PYTHONPATH), so a user's steps run from the user's project, not from eksflow's. Before anything starts, every
config section that declares `local_problems()` (a step's settings, e.g. a dataset that must exist here; the MLflow
server that must answer) is asked. A resume with other settings is refused, except settings marked REPORTING
(eksflow.runtime.args): they change where the run reports, not what it computes, and the resume takes them.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel
from rich.console import Console
from rich.markup import escape

from eksflow.config import PipelineConfig
from eksflow.errors import EXIT_FAILED, ConfigError
from eksflow.pipeline import Pipeline
from eksflow.runtime.args import is_reporting
from eksflow.runtime.libraries import check_installed
from eksflow.runtime.rundir import report_path
from eksflow.runtime.shown import shown

if TYPE_CHECKING:
    from eksflow.local import RunResult

M = TypeVar("M", bound=BaseModel)


def localized(model: M, base: Path) -> M:
    """`model` with every section that declares `localized(base)` (relative paths made absolute) replaced."""
    updates: dict[str, Any] = {}
    for name in type(model).model_fields:
        value = getattr(model, name)
        if isinstance(value, BaseModel):
            resolve = getattr(value, "localized", None)
            local = localized(resolve(base) if callable(resolve) else value, base)
            if local is not value:
                updates[name] = local
    return model.model_copy(update=updates) if updates else model


def local_problems(cfg: PipelineConfig) -> list[str]:
    """`section.field: problem` for every section that can tell its inputs cannot exist on this machine."""
    return [f"{key}.{line}" for key, section in _sections(cfg) for line in section.local_problems()]


def run_locally(
    pipeline: Pipeline, rendered: dict[str, Any], root: Path, args: argparse.Namespace, console: Console
) -> int:
    """Check the inputs this machine must have, then execute the manifest (or resume a run) in the project."""
    problems = local_problems(pipeline.cfg)
    if problems:
        raise ConfigError("\n".join(problems))
    check_installed(step_modules(rendered))  # one line now, not a traceback from each task
    if args.nodes > 1:
        from eksflow.local.pod_network import unavailable

        if why := unavailable():
            raise ConfigError(f"--nodes {args.nodes}: {why}")
    config = pipeline.cfg.model_dump(mode="json")
    given = bool(args.config or args.overrides or args.variant)  # else a resume keeps the run's own inputs
    return execute(
        rendered, args.state_dir, args.resume, console, root=root, memoize=not args.no_memoize, config=config,
        inputs_given=given, nodes=args.nodes, reporting=reporting_keys(type(pipeline.cfg)),
    )  # fmt: skip


def step_modules(rendered: Mapping[str, Any]) -> set[str]:
    """The step modules the manifest's container templates run (`python -m <module>`)."""
    modules = set()
    for template in rendered.get("spec", {}).get("templates", []):
        command = [*(template.get("container") or {}).get("command", [])]
        if command[1:2] == ["-m"] and len(command) > 2:
            modules.add(str(command[2]))
    return modules


def config_changes(saved: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """The dotted keys whose values differ between two configs, as `key (old -> new)`."""
    return list(_changes(saved, new).values())


def _changes(saved: Mapping[str, Any], new: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Each dotted key whose value differs, with `key (old -> new)`."""
    changed = {}
    for key in sorted(set(saved) | set(new)):
        old, value = saved.get(key), new.get(key)
        if isinstance(old, Mapping) and isinstance(value, Mapping):
            changed.update(_changes(old, value, f"{prefix}{key}."))
        elif old != value:
            changed[f"{prefix}{key}"] = f"{prefix}{key} ({_short(old)} -> {_short(value)})"
    return changed


def reporting_keys(model: type[BaseModel], prefix: str = "") -> frozenset[str]:
    """The dotted keys of the settings marked REPORTING: where a run reports (a tracking server, a link)."""
    keys: set[str] = set()
    for name, field in model.model_fields.items():
        if is_reporting(field):
            keys.add(f"{prefix}{name}")
        elif isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            keys |= reporting_keys(field.annotation, f"{prefix}{name}.")
    return frozenset(keys)


def _short(value: object) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def execute_env(root: Path) -> dict[str, str]:
    """What every local task gets: the project on its PYTHONPATH, and the checkout's commit for lineage."""
    python_path = os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH", "")) if p)
    return {"EKSFLOW_GIT_COMMIT": git_commit(root), "PYTHONPATH": python_path}


def execute(
    rendered: dict[str, Any],
    state_dir: Path,
    resume: str | None,
    console: Console,
    *,
    root: Path,
    memoize: bool = True,
    config: Mapping[str, Any] | None = None,
    inputs_given: bool = True,
    nodes: int = 1,
    reporting: frozenset[str] = frozenset(),
) -> int:
    """Run the manifest with the local executor (or resume run `resume`) and print what each task produced.

    A resume with no inputs given (`inputs_given` False: no --config, --set or --variant) keeps the run's own
    manifest and parameters, as `argo retry` does; with inputs, it is refused if they differ from the run's, but
    for the `reporting` keys (where the run reports, not what it computes): then the new manifest is the run's.
    A run that cannot start raises LocalExecutorError (RunNotFoundError for a missing run) for the CLI's `main`.
    """
    from eksflow.local import LocalExecutorError, RunInterrupted, resume_workflow, run_workflow
    from eksflow.local.runs import run_folder

    settings: dict[str, Any] = {
        "cwd": root, "env": execute_env(root), "console": console, "memoize": memoize, "nodes": nodes,
    }  # fmt: skip
    try:
        if resume is not None:  # `--resume ""` names no run: refused, never a fresh run
            folder = run_folder(state_dir, resume)
            saved = folder.read_config()
            changed = _changes(saved, config) if inputs_given and saved is not None and config is not None else {}
            if computing := [text for key, text in changed.items() if key not in reporting]:
                raise LocalExecutorError(
                    f"run {resume!r} started with other settings: {', '.join(computing)}; resume without "
                    "--config/--set to keep its own, re-run failed tasks with new parameter values (retry), or start "
                    "a new run"
                )
            if not inputs_given:
                result = resume_workflow(folder.path, **settings)
            elif changed:  # only where the run reports: the manifest built with them is the run's from now on
                taken = (
                    f"resuming {resume} with new {', '.join(changed.values())}: where it reports, not what it computes"
                )
                console.print(shown(taken), markup=False, highlight=False, soft_wrap=True)
                result = resume_workflow(folder.path, manifest=rendered, config=config, adopt=True, **settings)
            else:
                result = resume_workflow(folder.path, manifest=rendered, **settings)
        else:
            result = run_workflow(rendered, state_dir, config=config, **settings)
    except RunInterrupted as stopped:
        console.print(
            shown(f"interrupted: workflow {stopped.name} stopped; resume with: --resume {stopped.name}"),
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
        return stopped.exit_code  # 128 + the signal: 130 for Ctrl-C, 143 for SIGTERM, 129 for SIGHUP
    return print_result(result, console)


def print_result(result: RunResult, console: Console) -> int:
    """Every task's phase and outputs (container paths shown as this machine's folders), the report, what next.

    The phases are the executor's own: status.json may be behind them when the state folder could not be written.
    """
    from eksflow.local import Phase, load_run

    view = replace(load_run(result.run_dir.parent.parent, result.name), nodes=result.nodes)
    console.print()
    for key, node in view.nodes.items():
        cached = " (memoized: outputs of an earlier run)" if node.memoization and node.memoization.hit else ""
        console.print(
            f"[bold]{escape(shown(node.display_name))}[/bold] {node.phase}{cached}"
            + (f": {escape(shown(node.message))}" if node.message else ""),
            highlight=False,
        )
        for name, value in view.host_outputs(key).items():
            short = value if len(value) <= 160 else value[:157] + "..."
            console.print(shown(f"    {name} = {short}"), markup=False, highlight=False, soft_wrap=True)
    colour = "green" if result.phase is Phase.SUCCEEDED else "red"
    console.print(
        f"\nworkflow {escape(shown(result.name))} [{colour}]{result.phase}[/{colour}]  "
        f"(run folder: {escape(shown(str(result.run_dir)))})",
        soft_wrap=True,
    )
    report = report_path(result.run_dir)
    if report is not None:
        console.print(shown(f"report: {report}"), markup=False, highlight=False, soft_wrap=True)
    if result.resumable:
        console.print(shown(f"resume with: --resume {result.name}"), markup=False, highlight=False)
    elif result.bad_input:
        line = f"{', '.join(result.bad_input)} failed on bad input (exit 2): fix it, then start a new run"
        console.print(shown(line), markup=False, highlight=False, soft_wrap=True)
    return 0 if result.phase is Phase.SUCCEEDED else EXIT_FAILED


def git_commit(root: Path) -> str:
    """The checkout's HEAD commit, read from .git without running git; empty outside a checkout."""
    head = root / ".git" / "HEAD"
    try:
        ref = head.read_text(encoding="utf-8").strip()
        if ref.startswith("ref: "):
            return (root / ".git" / ref[5:]).read_text(encoding="utf-8").strip()
        return ref
    except OSError:
        return ""


def _sections(model: BaseModel, prefix: str = "") -> Iterator[tuple[str, Any]]:
    for name in type(model).model_fields:
        value = getattr(model, name)
        if isinstance(value, BaseModel):
            key = f"{prefix}{name}"
            if callable(getattr(value, "local_problems", None)):
                yield key, value
            yield from _sections(value, f"{key}.")
