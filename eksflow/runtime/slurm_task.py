"""One task of a Slurm job started by eksflow.runtime.slurm_job: exec the step's argv from the environment.

    srun "$EKSFLOW_PYTHON" -m eksflow.runtime.slurm_task      # the job script's only line that runs anything

The argv is EKSFLOW_STEP_ARGV, a JSON list the submitting task put in the job's environment, so no value of the
step ever becomes text of the batch script (or of any shell line). The process is replaced by the step: srun
sees the step's exit code and signals.
"""

from __future__ import annotations

import json
import os
import sys

from eksflow.errors import EXIT_BAD_INPUT

ARGV_ENV = "EKSFLOW_STEP_ARGV"


def main() -> int:
    """Replace this process by the step; exit 2 when the environment holds no argv list."""
    try:
        argv = json.loads(os.environ[ARGV_ENV])
    except (KeyError, ValueError) as err:
        print(f"bad input: ${ARGV_ENV} is not a JSON list of arguments ({type(err).__name__})", file=sys.stderr)
        return EXIT_BAD_INPUT
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        print(f"bad input: ${ARGV_ENV} must be a non-empty JSON list of strings", file=sys.stderr)
        return EXIT_BAD_INPUT
    os.execv(argv[0], argv)


if __name__ == "__main__":
    raise SystemExit(main())
