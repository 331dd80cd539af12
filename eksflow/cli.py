"""The command line every pipeline file shares: `python pipelines/<name>.py run|render|plan|submit|schedule`.

Config errors exit 2 with one line per problem before anything runs or is submitted; a failed workflow exits 1;
a local run stopped by Ctrl-C exits 130 with the way to resume it.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import yaml
from hera.workflows import Workflow
from rich.console import Console

from eksflow.config import ConfigError, PipelineConfig, load_config
from eksflow.profiles import PROFILES, VARIANT_DEFAULTS
from eksflow.templates import KINDS, cron_workflow, manifest, workflow_template
from steps.common.storage import is_s3, local_path

EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT: what a shell reports for a command stopped by Ctrl-C
PROJECT_ROOT = Path(__file__).resolve().parents[1]

Build = Callable[[PipelineConfig], Workflow]


def parser(prog: str) -> argparse.ArgumentParser:
    """`run` and `render`, each with --config and repeatable --set."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", type=Path, help="YAML file overriding the defaults (sections as in core/config.py)")
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
        prog=prog,
        description=(sys.modules["__main__"].__doc__ or "").strip(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
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
    render = commands.add_parser("render", parents=[common], help="print the Argo Workflow YAML")
    render.add_argument("-o", "--output", type=Path, help="write to this file instead of stdout")
    render.add_argument("--kind", choices=KINDS, default="Workflow", help="Workflow (default) or WorkflowTemplate")
    render.add_argument("--cron", help="with --kind CronWorkflow: the schedule, e.g. '0 3 * * 1'")
    render.add_argument("--timezone", help="with --kind CronWorkflow: IANA zone of the schedule (default UTC)")
    commands.add_parser("plan", parents=[common], help="preflight: pods, devices, memory, retries, cost; no submit")
    submit = commands.add_parser("submit", parents=[common], help="plan, then send the Workflow to an Argo Server")
    submit.add_argument("--argo-server", default=os.environ.get("ARGO_SERVER", ""), help="host:port ($ARGO_SERVER)")
    submit.add_argument("-n", "--namespace", default=os.environ.get("ARGO_NAMESPACE"), help="($ARGO_NAMESPACE)")
    submit.add_argument(
        "-k",
        "--insecure-skip-verify",
        action="store_true",
        default=os.environ.get("ARGO_INSECURE_SKIP_VERIFY") == "true",
        help="do not verify the server's certificate ($ARGO_INSECURE_SKIP_VERIFY=true)",
    )
    submit.add_argument(
        "-e",
        "--secure",
        action=argparse.BooleanOptionalAction,
        default=os.environ.get("ARGO_SECURE", "true") != "false",
        help="use TLS (default; $ARGO_SECURE=false for plain http)",
    )
    submit.add_argument("--argo-base-href", default=os.environ.get("ARGO_BASE_HREF", ""), help="($ARGO_BASE_HREF)")
    submit.add_argument("--watch", action="store_true", help="follow node phases until the workflow finishes")
    schedule = commands.add_parser("schedule", parents=[common], help="print a WorkflowTemplate and its CronWorkflow")
    schedule.add_argument("--cron", required=True, help="cron schedule, e.g. '0 3 * * 1'")
    schedule.add_argument("--timezone", help="IANA zone of the schedule, e.g. Europe/Paris (default UTC)")
    schedule.add_argument("-o", "--output", type=Path, help="write to this file instead of stdout")
    return root


def main(build: Build, argv: Sequence[str] | None = None) -> None:
    """Parse the command line, build the workflow from the config, and run or render it."""
    args = parser(Path(sys.argv[0]).name).parse_args(argv)
    console = Console(stderr=True)
    try:
        cfg = apply_variant(load_config(args.config, args.overrides), args.variant)
        if args.command == "render":
            raise SystemExit(render(build(cfg), args.output, args.kind, args.cron, args.timezone))
        if args.command == "schedule":
            raise SystemExit(render(build(cfg), args.output, "CronWorkflow", args.cron, args.timezone))
        if args.command in ("plan", "submit"):
            from eksflow.plan import check, print_plan

            print_plan(check(cfg), Console())
            if args.command == "submit":
                from eksflow.submit import SubmitError, submit

                try:
                    raise SystemExit(submit(manifest(build(cfg)), args, console))
                except SubmitError as err:
                    console.print(f"[red]submit failed:[/red] {err}", highlight=False, soft_wrap=True)
                    raise SystemExit(EXIT_FAILED) from None
            raise SystemExit(0)
        check_local_inputs(cfg)
        raise SystemExit(run(build(cfg), args.state_dir, args.resume, console))
    except ConfigError as err:
        for line in str(err).splitlines():
            console.print(f"[red]config error:[/red] {line}", highlight=False, soft_wrap=True)
        raise SystemExit(EXIT_BAD_INPUT) from None


def apply_variant(cfg: PipelineConfig, variant: str | None) -> PipelineConfig:
    """`--variant gpu`: keep a configured instance type of that kind, otherwise use the variant's default."""
    if variant is None or PROFILES[cfg.cluster.instance_type].kind == variant:
        return cfg
    cluster = cfg.cluster.model_copy(update={"instance_type": VARIANT_DEFAULTS[variant]})  # type: ignore[index]
    return cfg.model_copy(update={"cluster": cluster})


def render(
    workflow: Workflow,
    output: Path | None,
    kind: str = "Workflow",
    cron: str | None = None,
    timezone: str | None = None,
) -> int:
    """Print (or write) the manifest as YAML: the Workflow, its WorkflowTemplate, or a CronWorkflow running it."""
    rendered = manifest(workflow)
    if kind == "Workflow":
        documents = [rendered]
    elif kind == "WorkflowTemplate":
        documents = [workflow_template(rendered)]
    else:
        check_schedule(cron, timezone)
        documents = [workflow_template(rendered), cron_workflow(rendered, cron or "", timezone)]
    text = yaml.safe_dump_all(documents, sort_keys=False)
    if output is None:
        sys.stdout.write(text)
    else:
        output.write_text(text, encoding="utf-8")
    return 0


CRON_FIELD = re.compile(r"^(\*|\d+(-\d+)?)(/\d+)?(,(\*|\d+(-\d+)?)(/\d+)?)*$|^[A-Za-z]{3}(-[A-Za-z]{3})?$")


def check_schedule(cron: str | None, timezone: str | None) -> None:
    """Refuse a schedule Argo's cron parser would reject, before anything is written (S3)."""
    problems = []
    if not cron:
        problems.append("--cron: a CronWorkflow needs a schedule, e.g. --cron '0 3 * * 1'")
    elif not cron.startswith("@") and (len(cron.split()) != 5 or not all(CRON_FIELD.match(f) for f in cron.split())):
        problems.append(f"--cron {cron!r}: expected 5 fields (minute hour day month weekday), e.g. '0 3 * * 1'")
    if timezone:
        try:
            ZoneInfo(timezone)
        except (ZoneInfoNotFoundError, ValueError):
            problems.append(f"--timezone {timezone!r}: not an IANA time zone; use e.g. UTC or Europe/Paris")
    if problems:
        raise ConfigError("\n".join(problems))


def check_local_inputs(cfg: PipelineConfig) -> None:
    """Refuse a local run whose inputs cannot exist here, before anything starts."""
    if not is_s3(cfg.data.source):
        source = local_path(cfg.data.source)
        if not source.exists():
            raise ConfigError(
                f"data.source: {cfg.data.source!r} does not exist; point it at a dataset folder "
                "(e.g. --set data.source=data/demo) or an s3:// prefix"
            )


def run(workflow: Workflow, state_dir: Path, resume: str | None, console: Console) -> int:
    """Execute the manifest with the local executor and print what each task produced."""
    from eksflow.local import LocalExecutorError, Phase, RunInterrupted, resume_workflow, run_workflow

    env = {"EKSFLOW_GIT_COMMIT": _git_commit()}
    try:
        if resume:
            result = resume_workflow(
                state_dir / "runs" / resume, cwd=PROJECT_ROOT, env=env, console=console, manifest=manifest(workflow)
            )
        else:
            result = run_workflow(manifest(workflow), state_dir, cwd=PROJECT_ROOT, env=env, console=console)
    except RunInterrupted as stopped:
        console.print(
            f"interrupted: workflow {stopped.name} stopped; resume with: --resume {stopped.name}",
            highlight=False,
            soft_wrap=True,
        )
        return stopped.exit_code  # 128 + the signal: 130 for Ctrl-C, 143 for SIGTERM, 129 for SIGHUP
    except LocalExecutorError as err:
        console.print(f"[red]cannot run locally:[/red] {err}", highlight=False, soft_wrap=True)
        return EXIT_BAD_INPUT
    console.print()
    for node in result.nodes.values():
        console.print(
            f"[bold]{node.name}[/bold] {node.phase}" + (f": {node.message}" if node.message else ""), highlight=False
        )
        for name, value in node.outputs.items():
            shown = value if len(value) <= 160 else value[:157] + "..."
            console.print(f"    {name} = {shown}", highlight=False, soft_wrap=True)
    colour = "green" if result.phase is Phase.SUCCEEDED else "red"
    console.print(
        f"\nworkflow {result.name} [{colour}]{result.phase}[/{colour}]  (run folder: {result.run_dir})", soft_wrap=True
    )
    if result.resumable:
        console.print(f"resume with: --resume {result.name}")
    elif result.bad_input:
        console.print(f"{', '.join(result.bad_input)} failed on bad input (exit 2): fix it, then start a new run")
    return 0 if result.phase is Phase.SUCCEEDED else EXIT_FAILED


def _git_commit() -> str:
    head = PROJECT_ROOT / ".git" / "HEAD"
    try:
        ref = head.read_text(encoding="utf-8").strip()
        if ref.startswith("ref: "):
            return (PROJECT_ROOT / ".git" / ref[5:]).read_text(encoding="utf-8").strip()
        return ref
    except OSError:
        return ""
