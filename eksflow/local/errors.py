"""The local executor's exceptions: one for what it cannot run, one for a run stopped from outside."""

from __future__ import annotations

import signal

from eksflow.errors import EksflowError


class LocalExecutorError(EksflowError):
    """A manifest or run folder the local executor cannot run; the message names the field and the fix."""


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
