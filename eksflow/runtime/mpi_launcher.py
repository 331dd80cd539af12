"""An MPIJob launcher pod's first process: mpirun, which fails the pod when it ends 0 without the step's outputs.

    python -m eksflow.runtime.mpi_launcher --outputs-dir=DIR --expect=NAME... -- mpirun <options> python -m <step>

Open MPI 5's mpirun (PRRTE) can exit 0 after losing a remote daemon: with a worker node lost mid-training, mpirun
ended 255, 0 and 213 in three tries here. On 0 the launcher Job succeeds, the MPI Operator marks the MPIJob
Succeeded, and only the collector finds no outputs, with no retry left to train again. Rank 0 writes the step's
outputs after its last checkpoint, so mpirun's 0 counts only with every expected output file in DIR; otherwise this
process says so in one line and exits 1, and the launcher Job's backoff (then Argo's retry) starts an attempt that
resumes from the checkpoint. SIGTERM, SIGINT and SIGHUP are passed on to mpirun, which forwards them to every rank
(Kubernetes stops the launcher pod with SIGTERM; the ranks' Spot handler commits a checkpoint).
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
from pathlib import Path
from types import FrameType

from eksflow.errors import EXIT_BAD_INPUT, EXIT_FAILED

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def parser() -> argparse.ArgumentParser:
    """`--outputs-dir`, one `--expect` per output, then `--` and the mpirun command line."""
    cli = argparse.ArgumentParser(
        prog="python -m eksflow.runtime.mpi_launcher",
        description="Run mpirun; fail if it exits 0 without writing the step's outputs.",
    )
    cli.add_argument("--outputs-dir", type=Path, required=True, help="where the step writes its output files")
    cli.add_argument("--expect", action="append", default=[], metavar="NAME", help="an output file the step writes")
    cli.add_argument("command", nargs=argparse.REMAINDER, help="-- mpirun ...")
    return cli


def missing_outputs(outputs_dir: Path, expected: list[str]) -> list[str]:
    """The expected output files not in `outputs_dir`."""
    return [name for name in expected if not (outputs_dir / name).is_file()]


def main(argv: list[str] | None = None) -> int:
    """Run mpirun: its exit code (128 + N when signal N ended it), or 1 when it was 0 and an output is missing."""
    args = parser().parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        print("bad input: no command after `--`; usage: mpi_launcher --outputs-dir=DIR -- mpirun ...", file=sys.stderr)
        return EXIT_BAD_INPUT
    started: list[subprocess.Popen[bytes]] = []
    early: list[int] = []  # signals that came before mpirun started: it gets them once it has

    def forward(signum: int, frame: FrameType | None) -> None:
        if started:
            started[0].send_signal(signum)
        else:
            early.append(signum)

    previous = {signum: signal.signal(signum, forward) for signum in FORWARDED}
    try:
        try:
            proc = subprocess.Popen(command)  # the handlers are Python's: mpirun starts with the default ones
        except OSError as err:
            print(f"error: cannot start {command[0]!r}: {err.strerror}", file=sys.stderr)
            return EXIT_FAILED
        started.append(proc)
        for received in early:
            proc.send_signal(received)
        code = proc.wait()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if code < 0:
        return 128 - code
    missing = missing_outputs(args.outputs_dir, args.expect)
    if code == 0 and missing:
        print(
            f"error: mpirun exited 0 but the step wrote no {', '.join(missing)} in {args.outputs_dir}: a rank or "
            "its node was lost (Open MPI can end 0 then); failing this attempt so a retry resumes from the checkpoint",
            file=sys.stderr,
        )
        return EXIT_FAILED
    return code


if __name__ == "__main__":
    raise SystemExit(main())
