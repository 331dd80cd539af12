"""The command line every pipeline file shares: `python pipelines/<name>.py run|render|plan|submit|schedule|config`.

    if __name__ == "__main__":
        main(build)          # build(cfg: MyConfig) -> Pipeline; the config type comes from its annotation

Bad input (config, a pipeline that cannot be built, a file that cannot be written) exits 2 with one line per
problem before anything runs or is submitted; a failed workflow, or an Argo Server that cannot answer, exits 1; a
local run stopped by a signal exits 128 + the signal's number with the way to resume it. `main` is the one place
that turns an EksflowError into its lines (`<label>: <message>`) and its exit code: each error class carries both.
"""

from __future__ import annotations

import argparse
import inspect
import os
import sys
from collections.abc import Callable, Sequence
from importlib.machinery import PathFinder
from pathlib import Path
from typing import Any, NoReturn

import yaml
from rich.console import Console
from rich.markup import escape

from eksflow.cluster import cluster_of
from eksflow.config import PipelineConfig, config_type, load_config
from eksflow.errors import ConfigError, EksflowError, PipelineError
from eksflow.pipeline import Pipeline
from eksflow.profiles import PROFILES, VARIANT_DEFAULTS
from eksflow.render import KINDS, cron_workflow, manifest, workflow_template
from eksflow.runtime.shown import shown

# The API server refuses objects over ~1.5 MiB (etcd's request limit); leave room for the status Argo adds.
MAX_MANIFEST_BYTES = 1024 * 1024
MAX_NODES = 16  # simulated nodes of one run: each is a share of this machine

Build = Callable[[Any], Pipeline]


def _node_count(text: str) -> int:
    # ASCII digits only: int() also takes ' 2', '+2', '1_6' and other scripts' digits ('٢'), none a count typed here.
    count = int(text) if text.isascii() and text.isdigit() else 0
    if not 1 <= count <= MAX_NODES:
        raise argparse.ArgumentTypeError(f"must be a whole number from 1 to {MAX_NODES}, got {text!r}")
    return count


def project_root(build: Build) -> Path:
    """The folder holding the pipeline's top-level package: local tasks run there, with it on PYTHONPATH."""
    source = inspect.getsourcefile(build)
    folder = Path(source).resolve().parent if source else Path.cwd()
    while (folder / "__init__.py").is_file():
        folder = folder.parent
    return folder


def check_not_shadowed(root: Path) -> None:
    """Refuse a project whose own top-level `eksflow` (a package or a module) would be imported in its tasks.

    Tasks run in the project's folder with it first on PYTHONPATH, ahead of the installed library, so each would
    fail on its first `from eksflow import ...` with a traceback, and be retried. (A pipeline started with the
    project's folder on sys.path, as `python -m pipelines.x` from it, imports that package before any of eksflow
    runs: Python's own ImportError is all there can be.)
    """
    found = PathFinder.find_spec("eksflow", [str(root)])
    if found is None or found.origin is None:  # none, or a folder without __init__.py: the library still wins
        return
    if Path(found.origin).resolve() != Path(__file__).resolve().parent / "__init__.py":
        raise PipelineError(
            f"{found.origin}: the project's own `eksflow` shadows the eksflow library in its tasks, which run in "
            f"{root} with it first on PYTHONPATH; fix: give the project's own another name"
        )


def parser(prog: str, description: str) -> argparse.ArgumentParser:
    """Every command with its options; --config, --set and --variant shared."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", type=Path, help="YAML file overriding the defaults (sections as `config` lists)")
    common.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one value, e.g. --set train.max_steps=20 (repeatable; applied after --config)",
    )
    common.add_argument(
        "--variant",
        choices=sorted(VARIANT_DEFAULTS),
        help="accelerator kind; picks a default cluster.instance_type of that kind unless one is configured",
    )
    root = argparse.ArgumentParser(
        prog=prog, description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = root.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", parents=[common], help="run the whole workflow on this machine (no cluster)")
    run.add_argument(
        "--state-dir",
        type=Path,
        default=Path(os.environ.get("EKSFLOW_STATE_DIR", ".eksflow")),
        help="runs, logs and local volumes live here (default .eksflow)",
    )
    run.add_argument("--resume", metavar="RUN", help="resume a failed run by name; succeeded tasks are kept")
    run.add_argument(
        "--no-memoize", action="store_true", help="run every task, even those an earlier run's outputs would serve"
    )
    run.add_argument(
        "--nodes",
        type=_node_count,
        default=os.environ.get("EKSFLOW_NODES") or "1",  # empty means unset, as ${EKSFLOW_NODES:-1}
        help="simulated nodes for distributed jobs' pods, each with its own share, addresses and host names "
        "(root only; default $EKSFLOW_NODES or 1: this machine alone)",
    )
    render = commands.add_parser("render", parents=[common], help="print the Argo Workflow YAML")
    render.add_argument("-o", "--output", type=Path, help="write to this file instead of stdout")
    render.add_argument("--kind", choices=KINDS, default="Workflow", help="Workflow (default) or WorkflowTemplate")
    render.add_argument("--cron", help="with --kind CronWorkflow: the schedule, e.g. '0 3 * * 1'")
    render.add_argument("--timezone", help="with --kind CronWorkflow: IANA zone of the schedule (default UTC)")
    commands.add_parser("plan", parents=[common], help="preflight: pods, devices, memory, retries, cost; no submit")
    submit = commands.add_parser("submit", parents=[common], help="plan, then send the Workflow to an Argo Server")
    from eksflow.submit import add_connection_options

    add_connection_options(submit)
    submit.add_argument("--watch", action="store_true", help="follow node phases until the workflow finishes")
    schedule = commands.add_parser("schedule", parents=[common], help="print a WorkflowTemplate and its CronWorkflow")
    schedule.add_argument("--cron", required=True, help="cron schedule, e.g. '0 3 * * 1'")
    schedule.add_argument("--timezone", help="IANA zone of the schedule, e.g. Europe/Paris (default UTC)")
    schedule.add_argument("-o", "--output", type=Path, help="write to this file instead of stdout")
    config = commands.add_parser(
        "config", parents=[common], help="the effective config as YAML (a --config file); --keys or --schema"
    )
    shown = config.add_mutually_exclusive_group()
    shown.add_argument("--keys", action="store_true", help="every key with its type, default and description")
    shown.add_argument("--schema", action="store_true", help="the config's JSON schema, for editors")
    from eksflow.verbs import add_verbs

    add_verbs(commands, Path(os.environ.get("EKSFLOW_STATE_DIR", ".eksflow")))
    return root


def main(build: Build, argv: Sequence[str] | None = None) -> NoReturn:
    """Parse the command line, build the pipeline from its config, and run, render, plan or submit it."""
    module = sys.modules.get(build.__module__)
    description = ((module.__doc__ if module else "") or "").strip()
    args = parser(Path(sys.argv[0]).name, description).parse_args(argv)
    console = Console(stderr=True)
    try:
        raise SystemExit(dispatch(build, args, console))
    except EksflowError as err:
        _problems(console, err.label, str(err))
        raise SystemExit(err.exit_code) from None


def dispatch(build: Build, args: argparse.Namespace, console: Console) -> int:
    """Run one command; the errors eksflow raises on purpose (EksflowError) propagate to `main`."""
    from eksflow.verbs import VERBS, run_verb

    if args.command in VERBS:
        pipeline_name = str(config_type(build).model_fields["name"].default)
        return run_verb(args, pipeline_name, project_root(build), console)
    from eksflow.runtime.metrics import use_project

    root = project_root(build)
    check_not_shadowed(root)
    use_project(root)  # a config names custom metrics of this project's packages only
    cfg = apply_variant(load_config(config_type(build), args.config, args.overrides), args.variant)
    if args.command == "run":  # local paths mean the caller's folder; tasks run in the project's
        from eksflow.run import localized

        cfg = localized(cfg, Path.cwd())
    if args.command == "config":
        from eksflow.config_docs import print_config

        return print_config(cfg, keys=args.keys, schema=args.schema)
    pipeline = build(cfg)
    if args.command == "render":
        return render(pipeline, args.output, args.kind, args.cron, args.timezone)
    if args.command == "schedule":
        return render(pipeline, args.output, "CronWorkflow", args.cron, args.timezone)
    if args.command in ("plan", "submit"):
        from eksflow.plan import check, print_plan

        print_plan(check(pipeline), Console())
        if args.command == "plan":
            return 0
        from eksflow.submit import submit

        return submit(checked_manifest(pipeline), args, console)
    from eksflow.run import run_locally

    return run_locally(pipeline, checked_manifest(pipeline), root, args, console)


def apply_variant(cfg: PipelineConfig, variant: str | None) -> PipelineConfig:
    """`--variant gpu`: keep a configured instance type of that kind, otherwise use the variant's default."""
    if variant is None or PROFILES[cluster_of(cfg).instance_type].kind == variant:
        return cfg
    cluster = cluster_of(cfg).model_copy(update={"instance_type": VARIANT_DEFAULTS[variant]})  # type: ignore[index]
    return cfg.model_copy(update={"cluster": cluster})


def checked_manifest(pipeline: Pipeline) -> dict[str, Any]:
    """The manifest, refused (ConfigError) when the API server would refuse it for its size."""
    rendered = manifest(pipeline)
    size = len(yaml.safe_dump(rendered).encode())
    if size > MAX_MANIFEST_BYTES:
        raise ConfigError(
            f"the workflow is {size:,} bytes, over the {MAX_MANIFEST_BYTES:,} the Kubernetes API server takes; "
            "shorten long settings (prompts, paths) or put large content in files"
        )
    return rendered


def render(
    pipeline: Pipeline,
    output: Path | None,
    kind: str = "Workflow",
    cron: str | None = None,
    timezone: str | None = None,
) -> int:
    """Print (or write) the manifest as YAML: the Workflow, its WorkflowTemplate, or a CronWorkflow running it."""
    rendered = manifest(pipeline)
    if kind == "Workflow":
        documents = [rendered]
    elif kind == "WorkflowTemplate":
        documents = [workflow_template(rendered)]
    else:
        check_schedule(cron, timezone)
        documents = [workflow_template(rendered), cron_workflow(rendered, cron or "", timezone, pipeline.scheduled)]
    text = yaml.safe_dump_all(documents, sort_keys=False)
    if output is None:
        sys.stdout.write(text)
        return 0
    try:
        output.write_text(text, encoding="utf-8")
    except OSError as err:
        raise ConfigError(f"-o {output}: cannot write it ({err.strerror}); check that its folder exists") from None
    return 0


def check_schedule(cron: str | None, timezone: str | None) -> None:
    """Refuse a schedule Argo would reject, before anything is written (S3)."""
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    from eksflow.cron import check_cron

    problems = []
    if not cron:
        problems.append("--cron: a CronWorkflow needs a schedule, e.g. --cron '0 3 * * 1'")
    elif problem := check_cron(cron, timezone or ""):
        problems.append(f"--{problem}")  # the problem names the schedule: "cron '...': ..."
    if timezone:
        try:
            ZoneInfo(timezone)
        except (ZoneInfoNotFoundError, ValueError):
            problems.append(f"--timezone {timezone!r}: not an IANA time zone; use e.g. UTC or Europe/Paris")
    if problems:
        raise ConfigError("\n".join(problems))


def _problems(console: Console, label: str, text: str) -> None:
    for line in text.splitlines():
        console.print(f"[red]{label}:[/red] {escape(shown(line))}", highlight=False, soft_wrap=True)
