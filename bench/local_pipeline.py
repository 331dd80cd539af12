"""Local executor overhead per no-op step, against Metaflow and kfp.local (bench/local_pipeline_peers.py).

    .venv/bin/python bench/local_pipeline.py compare [--rounds 3]   # interleaved with the peers; prints the table
    .venv/bin/python bench/local_pipeline.py ab --baseline REF      # this tree against git REF's executor
    .venv/bin/python bench/local_pipeline.py run --steps 5          # one run (what the harness times)

`run` builds a Workflow manifest of N container tasks in a chain, each `python -c pass`, and runs it through
`eksflow.local.run_workflow` in a fresh state directory: the whole command is timed, interpreter start-up and
imports included, as the peers' `python flow.py run` is. `compare` hands `run --steps 2` and `run --steps 5` to the
peer harness as `--extra eksflow:2=...` and `--extra eksflow:5=...`, so it reports eksflow's time per step, its
marginal cost per step ((T5 - T2) / 3) and its ratio to the Metaflow flow with the nearest step count. The
harness installs Metaflow and kfp into /tmp/bench-metaflow and /tmp/bench-kfp on first use (pip).

`ab` times the same 2- and 5-step runs, interleaved round by round, for this tree and for the eksflow package of
another commit (exported with `git archive` into a temporary folder): on a shared, loaded machine the absolute
times drift, and only an interleaved comparison says whether a change cost anything.
"""

from __future__ import annotations

import argparse
import inspect
import io
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
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


def run(steps: int, root: Path = ROOT) -> int:
    """One local run of the chain with the eksflow package under `root`; exit 1 unless it Succeeded."""
    sys.path.insert(0, str(root))
    from rich.console import Console

    import eksflow
    from eksflow.local import run_workflow

    if not Path(eksflow.__file__).resolve().is_relative_to(root.resolve()):
        raise SystemExit(f"imported eksflow from {eksflow.__file__}, not from {root}")

    # An older executor may not know `memoize`; nothing here is memoized either way.
    extra = {"memoize": False} if "memoize" in inspect.signature(run_workflow).parameters else {}
    with tempfile.TemporaryDirectory(prefix="eksflow-bench-") as state:
        result = run_workflow(
            manifest(steps), Path(state), cwd=Path(state), console=Console(file=io.StringIO()), **extra
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


def ab(baseline: str, rounds: int) -> int:
    """This tree against the executor of git commit `baseline`: 2- and 5-step runs, interleaved, medians."""
    with tempfile.TemporaryDirectory(prefix="eksflow-baseline-") as folder:
        archive = subprocess.run(["git", "archive", baseline, "eksflow"], cwd=ROOT, capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", folder], input=archive.stdout, check=True)
        roots = {"this": ROOT, baseline: Path(folder)}
        times: dict[tuple[str, int], list[float]] = {(n, s): [] for n in roots for s in (2, 5)}
        for round_index in range(rounds + 1):  # round 0 warms the bytecode caches and is not counted
            for name, root in roots.items() if round_index % 2 else reversed(roots.items()):
                for steps in (2, 5):
                    command = [sys.executable, __file__, "run", "--steps", str(steps), "--root", str(root)]
                    started = time.perf_counter()
                    subprocess.run(command, check=True)
                    if round_index:
                        times[(name, steps)].append(time.perf_counter() - started)
        for name in roots:
            two, five = (statistics.median(times[(name, s)]) for s in (2, 5))
            print(f"{name:>10}: 2 steps {two:.2f} s, 5 steps {five:.2f} s, marginal {(five - two) / 3:.3f} s/step")
    return 0


def main(argv: list[str] | None = None) -> int:
    """`run`, `compare` or `ab`."""
    parser = argparse.ArgumentParser(prog="bench/local_pipeline.py", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    one = commands.add_parser("run", help="one local run of a chain of no-op tasks")
    one.add_argument("--steps", type=int, default=5)
    one.add_argument("--root", type=Path, default=ROOT, help="the folder holding the eksflow package to time")
    peers = commands.add_parser("compare", help="eksflow against Metaflow and kfp.local, interleaved")
    peers.add_argument("--rounds", type=int, default=3)
    against = commands.add_parser("ab", help="this tree against another commit's executor, interleaved")
    against.add_argument("--baseline", required=True, help="a git commit, e.g. the one before a change")
    against.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args(argv)
    if args.command == "run":
        return run(args.steps, args.root)
    return compare(args.rounds) if args.command == "compare" else ab(args.baseline, args.rounds)


if __name__ == "__main__":
    raise SystemExit(main())
