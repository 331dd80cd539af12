"""The Phase enum: a node's or a workflow's phase, as Argo spells it.

Its own module, importing nothing but the standard library's enum, so the watchdog (which runs without
site-packages, and whose start-up every run pays) can use it too.
"""

from __future__ import annotations

from enum import Enum


class Phase(str, Enum):
    """A node's or a workflow's phase, spelled as Argo spells it (status.json keeps these strings)."""

    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    ERROR = "Error"
    SKIPPED = "Skipped"
    OMITTED = "Omitted"

    def __str__(self) -> str:
        return self.value

    @property
    def fulfilled(self) -> bool:
        """Done, whatever the outcome (Argo's Fulfilled): nothing more will happen to the node."""
        return self in FULFILLED

    @property
    def completed(self) -> bool:
        """Ran to an outcome (Argo's Completed): Skipped and Omitted nodes did not run, so they are not."""
        return self in (Phase.SUCCEEDED, Phase.FAILED, Phase.ERROR)

    @property
    def failed_or_error(self) -> bool:
        """Failed or Error."""
        return self in (Phase.FAILED, Phase.ERROR)


FULFILLED = frozenset({Phase.SUCCEEDED, Phase.FAILED, Phase.ERROR, Phase.SKIPPED, Phase.OMITTED})
