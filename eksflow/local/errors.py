"""The local executor's exceptions: what it cannot run, a missing run, an unwritable state folder, a stopped run."""

from __future__ import annotations

import signal

from eksflow.errors import EXIT_BAD_INPUT, EksflowError, NotFoundError


class LocalExecutorError(EksflowError):
    """A manifest or run folder the local executor cannot run; the message names the field and the fix."""

    label = "cannot run locally"
    exit_code = EXIT_BAD_INPUT


class RunNotFoundError(LocalExecutorError, NotFoundError):
    """A run (or a task of a run) that the state folder does not hold; the message lists those it does."""

    label = "not found"
    exit_code = EXIT_BAD_INPUT


class StateWriteError(LocalExecutorError):
    """The state folder could not be written (read-only, full, no permission); one line naming the file and the fix.

    Before a run starts it refuses the run (exit 2); during a run, the run stops and ends Failed.
    """

    label = "cannot run locally"
    exit_code = EXIT_BAD_INPUT


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C, SIGTERM or SIGHUP stopped run `name`: its tasks were stopped and status.json says Failed, "interrupted".

    `signal` is the signal that stopped it; `exit_code` (128 + signal, what a shell reports) is the exit status a
    command line should end with. The run can be resumed.
    """

    def __init__(self, name: str, signum: int = signal.SIGINT) -> None:
        super().__init__(name)
        self.name = name
        self.signal = signum

    @property
    def exit_code(self) -> int:
        """128 + the signal number: 130 for Ctrl-C, 143 for SIGTERM, 129 for SIGHUP."""
        return 128 + int(self.signal)
