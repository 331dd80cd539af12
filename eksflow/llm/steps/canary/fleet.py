"""What the fleet did while a canary step measured: a replica it lost is the fleet's doing, not the candidate's.

Before it sends anything the step lists the fleet's replicas (the Service's endpoints: common/replicas.py) and reads
each ready one's finished-request counter (vLLM's vllm:request_success_total, which starts from 0 again when an
engine restarts); after its measurement it lists them again and asks each replica it started with whether it still
answers (/health). A replica that left the endpoints, is no longer ready, stopped answering or restarted in between
was lost by the fleet (its pod or its node went, as the executor or the cluster saw it, or its container restarted
in place), and requests in flight on it failed whatever the candidate is. A measurement that fails its rules
with such a loss is not the candidate's verdict: the step names the loss, waits until every replica the Service
lists as ready answers (the lost one out of its endpoints, a replacement in or on its way), and measures again, up
to MEASUREMENTS times. When no replica answers any more the fleet is down, not disturbed: the step fails naming the
dead part first, as before.

The same reading in a cluster and here: the endpoints come from the Kubernetes API there and from the list the
local fleet keeps in the run folder here, and every replica is asked on its own address either way.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

from eksflow.llm.steps.canary import Args
from eksflow.llm.steps.common import probe_cache, replicas, rollout, vllm_client
from eksflow.llm.steps.common.replicas import Replica
from eksflow.runtime.args import StepFailedError

MEASUREMENTS = 3  # a step measures at most this often: once, and again after each of two losses
RECOVERY_S = 600.0  # how long a step waits for the fleet to serve from every ready replica after a loss
_POLL_S = 2.0


@dataclass(frozen=True)
class Snapshot:
    """The fleet as a measurement starts: its ready replicas, and each one's finished requests (None: unknown)."""

    ready: tuple[Replica, ...]
    finished: Mapping[str, float | None]


@dataclass(frozen=True)
class FleetNote:
    """What a step's report says of the fleet: the replicas its judged measurement started on, and its losses.

    `lost`: the replicas the fleet lost during the judged measurement; `discarded`: each earlier measurement it
    lost one during (which, and how many requests failed), measured again.
    """

    replicas: tuple[Replica, ...]
    lost: list[str]
    discarded: list[str]

    def lines(self) -> list[str]:
        """The report's lines: the replicas measured on, then what the fleet lost, if anything."""
        lines = [f"fleet: {replicas.described(self.replicas)}"]
        lines += [f"not judged, measured again: {d}" for d in self.discarded]
        if self.lost:
            lines.append(f"lost during the judged measurement: {'; '.join(self.lost)}")
        return lines

    def report(self) -> dict[str, object]:
        """As the JSON report holds it."""
        return {"replicas": [r.describe() for r in self.replicas], "lost": self.lost, "discarded": self.discarded}


def snapshot(args: Args, api_key: str) -> Snapshot:
    """The fleet's ready replicas and their counters now (none, with a warning, when its endpoints cannot be read)."""
    try:
        ready = tuple(r for r in replicas.replicas(args.fleet, args.vllm_url) if r.ready)
    except StepFailedError as err:
        rollout.log(f"warning: a replica lost during this measurement will not be told apart from the candidate: {err}")
        return Snapshot((), {})
    return Snapshot(ready, {r.url: probe_cache.engine_requests(r.url, api_key) for r in ready})


def losses(args: Args, before: Snapshot, api_key: str) -> list[str]:
    """Each replica of `before` the fleet lost since, one clause each (none: the fleet stayed as it was)."""
    try:
        now = {r.url: r for r in replicas.replicas(args.fleet, args.vllm_url)}
    except StepFailedError as err:
        rollout.log(f"warning: the fleet's endpoints could not be read after the measurement: {err}")
        return []
    found = []
    for replica in before.ready:
        current = now.get(replica.url)
        if current is None or current.pod != replica.pod:
            found.append(f"{replica.describe()} left the fleet's endpoints (its pod ended or its node went)")
        elif not current.ready:
            found.append(f"{replica.describe()} is no longer ready")
        elif down := vllm_client.engine_down(replica.url):
            found.append(f"{replica.describe()} does not answer ({down})")
        elif restarted(before.finished.get(replica.url), probe_cache.engine_requests(replica.url, api_key)):
            found.append(f"{replica.describe()} restarted (its finished-request count started again from 0)")
    return found


def restarted(before: float | None, after: float | None) -> bool:
    """Whether an engine's finished-request counter went down: only a new engine's does (unknown: not restarted)."""
    return before is not None and after is not None and after < before


def serving(args: Args) -> bool:
    """Whether any ready replica of the fleet answers /health now (False: the fleet is down, not disturbed)."""
    try:
        now = replicas.replicas(args.fleet, args.vllm_url)
    except StepFailedError:
        return False
    return any(r.ready and not vllm_client.engine_down(r.url) for r in now)


def wait_whole(args: Args) -> str:
    """Until every replica the fleet's Service lists as ready answers /health (at least one); what it serves from.

    StepFailedError after RECOVERY_S, naming what still does not answer.
    """
    started = time.monotonic()
    while True:
        try:
            ready = [r for r in replicas.replicas(args.fleet, args.vllm_url) if r.ready]
        except StepFailedError as err:
            ready, why = [], str(err)
        else:
            silent = [f"{r.describe()}: {down}" for r in ready if (down := vllm_client.engine_down(r.url))]
            why = "; ".join(silent) or "no replica is ready"
            if ready and not silent:
                return f"the fleet serves from {replicas.described(ready)} after {time.monotonic() - started:.0f} s"
        if time.monotonic() - started > RECOVERY_S:
            raise StepFailedError(
                f"the fleet did not serve from every ready replica within {RECOVERY_S:g} s of losing one ({why}); "
                "the candidate was not judged"
            )
        time.sleep(_POLL_S)
