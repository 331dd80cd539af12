"""The command line every pipeline file shares: `python pipelines/<name>.py run|render [options]`.

Config errors exit 2 with one line per problem before anything runs; a failed workflow exits 1.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import yaml
from hera.workflows import Workflow
from rich.console import Console

from pipelines.core.config import ConfigError, PipelineConfig, load_config
from pipelines.core.templates import manifest
from steps.common.storage import is_s3, local_path

EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
PROJECT_ROOT = Path(__file__).resolve().parents[2]

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
    return root


def main(build: Build, argv: Sequence[str] | None = None) -> None:
    """Parse the command line, build the workflow from the config, and run or render it."""
    args = parser(Path(sys.argv[0]).name).parse_args(argv)
    console = Console(stderr=True)
    try:
        cfg = load_config(args.config, args.overrides)
        if args.command == "render":
            raise SystemExit(render(build(cfg), args.output))
        check_local_inputs(cfg)
        raise SystemExit(run(build(cfg), args.state_dir, args.resume, console))
    except ConfigError as err:
        for line in str(err).splitlines():
            console.print(f"[red]config error:[/red] {line}", highlight=False, soft_wrap=True)
        raise SystemExit(EXIT_BAD_INPUT) from None


def render(workflow: Workflow, output: Path | None) -> int:
    """Print (or write) the manifest as YAML."""
    text = yaml.safe_dump(manifest(workflow), sort_keys=False)
    if output is None:
        sys.stdout.write(text)
    else:
        output.write_text(text, encoding="utf-8")
    return 0


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
    from pipelines.local import resume_workflow, run_workflow

    env = {"EKSFLOW_GIT_COMMIT": _git_commit()}
    if resume:
        result = resume_workflow(state_dir / "runs" / resume, cwd=PROJECT_ROOT, env=env, console=console)
    else:
        result = run_workflow(manifest(workflow), state_dir, cwd=PROJECT_ROOT, env=env, console=console)
    console.print()
    for node in result.nodes.values():
        console.print(
            f"[bold]{node.name}[/bold] {node.phase}" + (f": {node.message}" if node.message else ""), highlight=False
        )
        for name, value in node.outputs.items():
            shown = value if len(value) <= 160 else value[:157] + "..."
            console.print(f"    {name} = {shown}", highlight=False, soft_wrap=True)
    colour = "green" if result.phase == "Succeeded" else "red"
    console.print(
        f"\nworkflow {result.name} [{colour}]{result.phase}[/{colour}]  (run folder: {result.run_dir})", soft_wrap=True
    )
    if result.phase != "Succeeded":
        console.print(f"resume with: --resume {result.name}")
    return 0 if result.phase == "Succeeded" else EXIT_FAILED


def _git_commit() -> str:
    head = PROJECT_ROOT / ".git" / "HEAD"
    try:
        ref = head.read_text(encoding="utf-8").strip()
        if ref.startswith("ref: "):
            return (PROJECT_ROOT / ".git" / ref[5:]).read_text(encoding="utf-8").strip()
        return ref
    except OSError:
        return ""
