"""How many live requests a canary step sends: as many as verifying its routed share needs, and no more.

The analysis checks the candidate's share of the live requests with the rule share_z <= z (canary.thresholds,
z = 4 by default), share_z = |share - w| / sqrt(w (1 - w) / n) at weight w. `canary.share_tolerance` (tol) is the
deviation of the routed share a step must be able to flag, and n follows from it:

- 0 < w < 1: n >= z^2 w (1 - w) / tol^2, so that a share off by tol reaches share_z = z. A router off by tol
  fails the rule about half the time and one off by 2 tol almost always (its share_z is near 2 z), while a correct
  router fails it with the normal tail at z (6.3e-5 at z = 4); the binomial variance w (1 - w) is largest at
  50 %, so the middle step sends the most. At tol = 0.25, z = 4: 24 requests at 10 %, 64 at 50 %.
- w = 1: the binomial standard error is 0 and one request answered elsewhere fails the rule (share_z is then
  infinite), so no correct router ever fails; what n buys is the chance to see a leak. A router sending a share
  tol elsewhere goes unseen with probability (1 - tol)^n, held to the same two-sided normal tail at z the rule
  allows a correct router elsewhere: n >= ln(tail(z)) / ln(1 - tol), 34 at tol = 0.25, z = 4.
- at least MIN_LIVE_REQUESTS (20) whatever the bound: p95_latency_s is the nearest-rank 95th percentile,
  ordered[ceil(0.95 n) - 1], which is the slowest request itself below 20 samples; from 20 on, one stray slow
  request no longer decides it. The same 20 requests give error_rate <= 0 a 64 % chance to catch a fleet failing
  5 % of its requests (the probes add theirs).

Without a share_z rule there is no share to verify and the floor alone applies. A step needing more than
MAX_LIVE_REQUESTS is a configuration error (CanarySettings says which tolerance and step).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from eksflow.llm.steps.common.gate import Threshold

SHARE_METRIC = "share_z"
PERCENTILE = 0.95  # p95_latency_s
MIN_LIVE_REQUESTS = math.ceil(1 / (1 - PERCENTILE))  # 20: the nearest-rank p95 is no longer the maximum
MAX_LIVE_REQUESTS = 10_000  # a step's traffic at most (a tolerance needing more is refused when validated)
_ROUNDING = 1e-9  # 64.00000000001 is 64 requests, not 65


@dataclass(frozen=True)
class Sizing:
    """A step's live request count and the bound it came from (stated in the step's report)."""

    requests: int
    weight: float  # the candidate's share at this step, 0..1
    tolerance: float
    z: float | None  # the share_z limit of the rules; None: no share rule
    bound: float  # the requests the share bound alone asks for (before rounding up and the floor)

    def describe(self) -> str:
        """One line: n and why, e.g. `24 live requests: a share off by 0.25 from 10% reaches share_z 4 ...`."""
        w, tol = self.weight, self.tolerance
        if w == 0:
            return "0 live requests: the pre-traffic step, before the candidate takes any; only the probes ask it"
        if self.z is None:
            why = f"no {SHARE_METRIC} rule to size for"
        elif w < 1:
            why = (
                f"a share off by {tol:g} from {w:.0%} reaches {SHARE_METRIC} {self.z:g} from "
                f"n >= {self.z:g}^2 * {w:g} * {1 - w:g} / {tol:g}^2 = {self.bound:.2f}"
            )
        else:
            why = (
                f"a router sending {tol:g} of the traffic elsewhere goes unseen with (1 - {tol:g})^n <= "
                f"{_tail(self.z):.2g}, the normal tail at {self.z:g}, from n >= {self.bound:.2f}"
            )
        return f"{self.requests} live requests: {why}; at least {MIN_LIVE_REQUESTS} for p95_latency_s"


def share_z_limit(rules: Sequence[Threshold]) -> float | None:
    """The strictest upper limit the rules put on share_z (None when no rule bounds it from above)."""
    limits = [r.value for r in rules if r.metric == SHARE_METRIC and r.op in ("<=", "<")]
    return min(limits) if limits else None


def live_requests(weight: float, tolerance: float, z: float | None) -> Sizing:
    """The live requests a step at `weight` (0 <= weight <= 1) sends to verify its share within `tolerance`.

    0 at weight 0, the pre-traffic step: the candidate takes no live request, so there is no share to verify.
    """
    if not 0 <= weight <= 1 or not 0 < tolerance < 1:
        raise ValueError(f"weight must be in [0, 1] and tolerance in (0, 1); got {weight}, {tolerance}")
    if weight == 0:
        return Sizing(requests=0, weight=0.0, tolerance=tolerance, z=z, bound=0.0)
    if z is None or z <= 0:  # no share rule, or one no share passes except the exact weight: nothing to size
        bound = 0.0
    elif weight < 1:
        bound = z * z * weight * (1 - weight) / (tolerance * tolerance)
    else:
        tail = _tail(z)
        bound = math.log(tail) / math.log(1 - tolerance) if tail > 0 else math.inf
    requests = max(MIN_LIVE_REQUESTS, math.ceil(bound - _ROUNDING)) if math.isfinite(bound) else MAX_LIVE_REQUESTS + 1
    return Sizing(requests=requests, weight=weight, tolerance=tolerance, z=z, bound=bound)


def _tail(z: float) -> float:
    """P(|N(0, 1)| > z): how often a correct router fails share_z <= z where the normal approximation holds."""
    return math.erfc(z / math.sqrt(2))
