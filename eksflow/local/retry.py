"""retryStrategy, locally: which failed attempts are retried, and after how long.

As Argo does it: the policy picks the phases retried (Always: Failed and Error; OnFailure: Failed; OnError and
OnTransientError: Error, which here means the process could not even start), the expression (if any) must hold for
the last attempt, the delay is duration x factor^retries capped by `cap`, and no retry starts after maxDuration,
counted from the first attempt's start.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from eksflow.local.expressions import ExpressionError, evaluate_retry_expression
from eksflow.local.model import Retry
from eksflow.local.phase import Phase
from eksflow.local.substitution import Scope, UnresolvedError

_RETRIED = {
    "Always": frozenset({Phase.FAILED, Phase.ERROR}),
    "OnFailure": frozenset({Phase.FAILED}),
    "OnError": frozenset({Phase.ERROR}),
    "OnTransientError": frozenset({Phase.ERROR}),
}


@dataclass
class Attempt:
    """The outcome of one attempt of a task."""

    phase: Phase
    exit_code: int | None
    message: str
    duration_s: float
    retriable: bool = True  # False: the same inputs would fail the same way (an unresolved reference, a refusal)
    outputs: dict[str, str] = field(default_factory=dict)


def next_delay(
    retry: Retry | None, done: int, attempt: Attempt, first_start: float, scope: Scope
) -> tuple[float | None, str]:
    """Seconds to wait before retry `done` + 1, or None and why no retry is made ("" if the strategy allows none)."""
    if retry is None or done >= retry.limit or not attempt.retriable:
        return None, ""
    if attempt.phase not in _RETRIED[retry.policy]:
        return None, ""
    if retry.expression:
        variables = {
            "lastRetry.exitCode": "-1" if attempt.exit_code is None else str(attempt.exit_code),
            "lastRetry.status": str(attempt.phase),
            "lastRetry.duration": str(int(attempt.duration_s)),
            "lastRetry.message": attempt.message,
        }
        try:
            if not evaluate_retry_expression(scope.substitute(retry.expression), variables):
                return None, f"; not retried: {retry.expression!r} is false"
        except (ExpressionError, UnresolvedError) as exc:
            return None, f"; not retried: {exc}"
    delay = retry.backoff_s * retry.factor**done
    if retry.cap_s is not None:
        delay = min(delay, retry.cap_s)
    if retry.max_duration_s is not None and time.monotonic() - first_start + delay > retry.max_duration_s:
        since = "counted from the first attempt's start"
        return None, f"; not retried: backoff.maxDuration={retry.max_duration_s:g}s ({since}) reached"
    return delay, ""
