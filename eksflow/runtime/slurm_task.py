"""One task of a Slurm job started by eksflow.runtime.slurm_job: run the step's argv from the environment.

    srun "$EKSFLOW_PYTHON" -m eksflow.runtime.slurm_task      # the job script's only line that runs anything

The argv is EKSFLOW_STEP_ARGV, a JSON list the submitting task put in the job's environment, so no value of the
step ever becomes text of the batch script (or of any shell line). The step runs as this process's child and its
exit code is this task's. When the step refuses its input (exit 2) this task also writes the file named by
EKSFLOW_REFUSED_FILE: srun's --kill-on-bad-exit then terminates the other tasks, srun's exit code becomes theirs
(143), and the file is how the submitter still knows the job ended on bad input, which is never retried.
Slurm signals every process of the step (SIGTERM before SIGKILL), the step included; this task waits for it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from types import FrameType

from eksflow.errors import EXIT_BAD_INPUT

ARGV_ENV = "EKSFLOW_STEP_ARGV"
REFUSED_ENV = "EKSFLOW_REFUSED_FILE"


def main() -> int:
    """Run the step to its end; its exit code (128 + N when signal N ended it), or 2 without an argv list."""
    try:
        argv = json.loads(os.environ[ARGV_ENV])
    except (KeyError, ValueError) as err:
        print(f"bad input: ${ARGV_ENV} is not a JSON list of arguments ({type(err).__name__})", file=sys.stderr)
        return EXIT_BAD_INPUT
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        print(f"bad input: ${ARGV_ENV} must be a non-empty JSON list of strings", file=sys.stderr)
        return EXIT_BAD_INPUT

    # A handler, not SIG_IGN (which the step would inherit): the step starts with the default disposition.
    def wait_for_the_step(signum: int, frame: FrameType | None) -> None:
        """The step got the same signal from Slurm: this task ends when it does."""

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, wait_for_the_step)
    code = subprocess.call(argv)
    if code == EXIT_BAD_INPUT and os.environ.get(REFUSED_ENV):
        Path(os.environ[REFUSED_ENV]).touch()
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    raise SystemExit(main())
