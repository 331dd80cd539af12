"""Cron schedules as Argo reads them: refused here, before a CronWorkflow is written, rather than at apply time."""

from __future__ import annotations

import re

FIELD = re.compile(r"^(\*|\d+(-\d+)?)(/\d+)?(,(\*|\d+(-\d+)?)(/\d+)?)*$|^[A-Za-z]{3}(-[A-Za-z]{3})?$")


def check_cron(expression: str) -> str | None:
    """Why Argo would refuse `expression`, or None when it is a schedule."""
    fields = expression.split()
    if expression.startswith("@"):
        return None
    if len(fields) != 5 or not all(FIELD.match(f) for f in fields):
        return "expected 5 fields (minute hour day month weekday), e.g. '0 3 * * 1'"
    return None
