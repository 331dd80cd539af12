"""Local executor overhead per no-op step, against Metaflow and kfp.local (bench/local_pipeline_peers.py).

    .venv/bin/python bench/local_pipeline.py compare [--rounds 3]   # interleaved with the peers; prints the table
    .venv/bin/python bench/local_pipeline.py run --steps 5          # one run (what the harness times)

`run` builds a Workflow manifest of N container tasks in a chain, each `python -c pass`, and runs it through
`eksflow.local.run_workflow` in a fresh state directory: the whole command is timed, interpreter start-up and
imports included, as the peers' `python flow.py run` is. `compare` hands `run --steps 2` and `run --steps 5` to the
peer harness as `--extra eksflow:2=...` and `--extra eksflow:5=...`, so it reports eksflow's time per step, its
marginal cost per step ((T5 - T2) / 3) and its ratio to the Metaflow flow with the nearest step count. The
harness installs Metaflow and kfp into /tmp/bench-metaflow and /tmp/bench-kfp on first use (pip).
"""

from __future__ import annotations

import argparse
import io
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent


def manifest(steps: int) -> dict[str, Any]:
    """A chain of `steps` no-op container tasks: step-1 -> step-2 -> ... (Metaflow's linear flow, kfp's chain)."""
    tasks: list[dict[str, Any]] = []
    for i in range(1, steps + 1):
        tasks.append({"name": f"step-{i}", "template": "noop", **({"depends": f"step-{i - 1}"} if i > 1 else {})})
    noop = {"name": "noop", "container": {"image": "python:3.11", "command": ["python", "-c", "pass"]}}
    return {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Workflow",
        "metadata": {"generateName": "bench-"},
        "spec": {"entrypoint": "main", "templates": [noop, {"name": "main", "dag": {"tasks": tasks}}]},
    }


def run(steps: int) -> int:
    """One local run of the chain; exit 1 unless it Succeeded."""
    sys.path.insert(0, str(ROOT))
    from rich.console import Console

    from eksflow.local import run_workflow

    with tempfile.TemporaryDirectory(prefix="eksflow-bench-") as state:
        result = run_workflow(
            manifest(steps), Path(state), cwd=Path(state), console=Console(file=io.StringIO()), memoize=False
        )
    if result.phase != "Succeeded":
        print(f"bench run {result.name} {result.phase}: {result.message}", file=sys.stderr)
        return 1
    return 0


def compare(rounds: int) -> int:
    """Run the peer harness with eksflow's 2- and 5-step runs as its extras."""
    own = f"{shlex.quote(sys.executable)} {shlex.quote(str(Path(__file__).resolve()))} run --steps"
    command = [sys.executable, str(BENCH / "local_pipeline_peers.py"), "--rounds", str(rounds)]
    for steps in (2, 5):
        command += ["--extra", f"eksflow:{steps}={own} {steps}"]
    return subprocess.run(command, check=False).returncode


def main(argv: list[str] | None = None) -> int:
    """`run` or `compare`."""
    parser = argparse.ArgumentParser(prog="bench/local_pipeline.py", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    one = commands.add_parser("run", help="one local run of a chain of no-op tasks")
    one.add_argument("--steps", type=int, default=5)
    peers = commands.add_parser("compare", help="eksflow against Metaflow and kfp.local, interleaved")
    peers.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    return run(args.steps) if args.command == "run" else compare(args.rounds)


if __name__ == "__main__":
    raise SystemExit(main())
