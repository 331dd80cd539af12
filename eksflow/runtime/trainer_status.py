"""Progress, ETA and metrics in a TrainJob's `status.trainerStatus` (Kubeflow Trainer v2, KEP-2779).

What the Trainer does, read from kubeflow/trainer at tag v2.3.0 (commit 658725bdae5c7e3a0854d93ac6ff492e109a22ab):

- proposals/2779-trainjob-progress/README.md (KEP-2779) and the user guide (user-guides/trainjob-progress.md under
  docs): a push design. The `TrainJobStatus` feature gate (pkg/features/features.go: alpha, off by default;
  `--feature-gates=TrainJobStatus=true`) turns on an HTTPS server in the controller manager; a trainer pod POSTs its
  status to it, and the controller applies it to the TrainJob's `status.trainerStatus`. Clients are asked to
  throttle ("at most once every 5 seconds", as the Kubeflow SDK's `update_trainjob_status` does), to re-read the
  token file rather than cache it (the JWT rotates), and to never let a failed request break the training loop.
- pkg/runtime/framework/plugins/trainjobstatus/trainjobstatus.go: with the gate on, every container of the trainer's
  pods gets KUBEFLOW_TRAINER_SERVER_URL (`https://kubeflow-trainer-controller-manager.<operator namespace>.svc:10443`
  + the path below; port from pkg/apis/config/v1alpha1 StatusServer.Port, default 10443),
  KUBEFLOW_TRAINER_SERVER_CA_CERT (`/var/run/secrets/kubeflow/trainer/ca.crt`: the webhook's CA, copied into the
  ConfigMap `<trainjob>-tls-config`) and KUBEFLOW_TRAINER_SERVER_TOKEN (`/var/run/secrets/kubeflow/trainer/token`:
  a projected service-account token, 3600 s, audience `trainer.kubeflow.org/v1alpha1/namespaces/<ns>/trainjobs/
  <name>/status` in pkg/statusserver/utils.go; the KEP's plain `trainer.kubeflow.org` was narrowed to one TrainJob).
- pkg/statusserver/server.go, auth.go: `POST /apis/trainer.kubeflow.org/v1alpha1/namespaces/{namespace}/trainjobs/
  {name}/status`, `Authorization: Bearer <token>` (OIDC-verified: signature, expiry, that audience, the pod's
  namespace), a JSON body `{"trainerStatus": {...}}` (UpdateTrainJobStatusRequest, pkg/apis/trainer/v1alpha1/
  trainjob_types.go) of at most 64 KiB; 200 with the body echoed, else a metav1.Status (403, 422, 404, 500).
- manifests/base/crds/trainer.kubeflow.org_trainjobs.yaml (vendored in tests/contract/schemas/kubeflow-trainer):
  `status.trainerStatus` holds progressPercentage (int32, 0-100), estimatedRemainingSeconds (int32, >= 0), metrics
  (at most 256 items of {name, value}, both strings of 1-64 characters) and lastUpdatedTime (date-time, required
  by a CEL rule whenever trainerStatus is set).

Here: rank 0 reports, only when the three variables are set (outside a TrainJob, `reporter()` gives None), at most
once every MIN_INTERVAL_S and always its last state at the end. Each request goes on a thread of its own, so a slow
or unreachable endpoint never holds a training step; a failure prints one line (then at most one a minute, never
the token) and training goes on. The token and the CA are read from their files on each request (both rotate).
"""

from __future__ import annotations

import http.client
import json
import math
import os
import re
import ssl
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from types import TracebackType
from typing import Any

from eksflow.runtime.outputs import output_text

ENV_URL = "KUBEFLOW_TRAINER_SERVER_URL"
ENV_CA_CERT = "KUBEFLOW_TRAINER_SERVER_CA_CERT"
ENV_TOKEN = "KUBEFLOW_TRAINER_SERVER_TOKEN"

MIN_INTERVAL_S = 5.0  # between two requests: the rate the Trainer's guide and the Kubeflow SDK keep to
TIMEOUT_S = 5.0  # per request (connect, and each read): the controller's own write timeout is 10 s
WARN_EVERY_S = 60.0  # at most one line a minute about an endpoint that keeps failing
FIELD_MAX = 64  # characters of a metric's name or value (the CRD's maxLength)
METRICS_MAX = 256  # items in `metrics` (the CRD's maxItems)
INT32_MAX = 2**31 - 1  # progressPercentage and estimatedRemainingSeconds are int32
BEARER = re.compile(r"[A-Za-z0-9._~+/-]+=*")  # RFC 6750's b64token: what a JWT is; nothing that could end a header


@dataclass(frozen=True)
class Endpoint:
    """Where the Trainer's controller takes this TrainJob's status, and the files that authenticate the request."""

    url: str
    ca_file: str
    token_file: str

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Endpoint | None:
        """The endpoint the Trainer injected into this container; None outside a TrainJob (or with the gate off)."""
        url, ca_file, token_file = env.get(ENV_URL, ""), env.get(ENV_CA_CERT, ""), env.get(ENV_TOKEN, "")
        if not url:
            return None
        if not (url.startswith("https://") and _host_and_port(url) and ca_file and token_file):
            print(
                f"[trainer status] not reported: {ENV_URL} needs an https:// URL beside {ENV_CA_CERT} and {ENV_TOKEN}",
                file=sys.stderr,
                flush=True,
            )
            return None
        return cls(url, ca_file, token_file)


def _host_and_port(url: str) -> bool:
    """Whether `url` names a host, and a port if any that is a number in range."""
    try:
        split = urllib.parse.urlsplit(url)
        return bool(split.hostname) and (split.port is None or split.port > 0)
    except ValueError:  # a port that is not a number, or out of range
        return False


def status_body(
    done: int, total: int, remaining_s: float | None, metrics: Mapping[str, object], observed_at: datetime
) -> dict[str, Any]:
    """The request body (UpdateTrainJobStatusRequest): progress, ETA, metrics, within the CRD's bounds.

    The percentage is floored, so 100 means every step is done; a metric's name and value are cut to FIELD_MAX
    characters and the list to METRICS_MAX items; an empty name or value is left out (the CRD wants 1 or more).
    """
    done = min(max(done, 0), total)
    status: dict[str, Any] = {"progressPercentage": 100 * done // max(total, 1)}
    if remaining_s is not None and math.isfinite(remaining_s):
        status["estimatedRemainingSeconds"] = min(max(round(remaining_s), 0), INT32_MAX)
    items = [
        {"name": name[:FIELD_MAX], "value": output_text(value)[:FIELD_MAX]}
        for name, value in {"step": done, "total_steps": total, **metrics}.items()
    ]
    status["metrics"] = [item for item in items if item["name"] and item["value"]][:METRICS_MAX]
    # metav1.Time: RFC 3339 in UTC, whole seconds (what the API server stores)
    status["lastUpdatedTime"] = observed_at.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"trainerStatus": status}


def post(endpoint: Endpoint, body: Mapping[str, Any], timeout_s: float) -> None:
    """POST `body` as JSON with the token read now, the server verified against the CA read now; raise on failure.

    http.client rather than urllib: it follows no redirect (urllib would repeat the request, bearer token included,
    wherever a 3xx points) and takes no proxy from the environment between the pod and its cluster's service.
    """
    token = Path(endpoint.token_file).read_text(encoding="utf-8").strip()
    if not BEARER.fullmatch(token):
        raise ValueError(f"{endpoint.token_file} holds no bearer token")
    url = urllib.parse.urlsplit(endpoint.url)
    context = ssl.create_default_context(cafile=endpoint.ca_file)
    connection = http.client.HTTPSConnection(url.hostname or "", url.port, timeout=timeout_s, context=context)
    try:
        connection.request(
            "POST",
            url.path + (f"?{url.query}" if url.query else ""),
            json.dumps(body).encode(),
            {"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )
        response = connection.getresponse()
        response.read()  # the echoed body, or the server's metav1.Status: not shown
    finally:
        connection.close()
    if response.status != 200:
        raise http.client.HTTPException(f"HTTP {response.status} {response.reason}")


def in_background(work: Callable[[], None]) -> None:
    """Run `work` on a thread of its own, which does not keep the process alive."""
    threading.Thread(target=work, name="trainer-status", daemon=True).start()


Send = Callable[[Endpoint, Mapping[str, Any], float], None]


class TrainerStatusReporter:
    """Rank 0's progress, ETA and latest metrics to the TrainJob's status: throttled, never in training's way.

    `update` is called at every step; a request goes out when MIN_INTERVAL_S has passed since the last one (or at the
    last step) and none is still on its way. Leaving the `with` block sends the latest state if it was not sent yet.
    The ETA is the time per step of this attempt so far times the steps left (a resumed run counts from its resume).
    """

    def __init__(
        self,
        endpoint: Endpoint,
        total_steps: int,
        *,
        clock: Callable[[], float] = time.monotonic,
        now: Callable[[], datetime] = lambda: datetime.now(timezone.utc),
        send: Send = post,
        dispatch: Callable[[Callable[[], None]], None] = in_background,
        min_interval_s: float = MIN_INTERVAL_S,
        timeout_s: float = TIMEOUT_S,
    ) -> None:
        self.endpoint = endpoint
        self.total_steps = max(total_steps, 1)
        self._clock, self._now, self._send, self._dispatch = clock, now, send, dispatch
        self._min_interval_s, self._timeout_s = min_interval_s, timeout_s
        self._first: tuple[float, int] | None = None  # (clock, done) at the first update: the ETA's origin
        self._latest: dict[str, Any] | None = None  # the newest body
        self._handed: dict[str, Any] | None = None  # the body last handed to a request
        self._last_request_at: float | None = None
        self._idle = threading.Event()  # set while no request is on its way
        self._idle.set()
        self._lock = threading.Lock()  # the failure count and warning time, written by request threads
        self._failures = 0  # since the last line printed about them
        self._warned_at: float | None = None

    def __enter__(self) -> TrainerStatusReporter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def update(self, done: int, metrics: Mapping[str, object]) -> None:
        """Take rank 0's step count and latest metrics; send them now if the throttle and the last request allow."""
        at = self._clock()
        if self._first is None:
            self._first = (at, done)
        first_at, first_done = self._first
        left = self.total_steps - done
        remaining_s = (at - first_at) / (done - first_done) * left if done > first_done else None
        self._latest = status_body(done, self.total_steps, 0.0 if left <= 0 else remaining_s, metrics, self._now())
        due = self._last_request_at is None or at - self._last_request_at >= self._min_interval_s or left <= 0
        if due and self._idle.is_set():  # one on its way: the next due update carries newer numbers
            self._last_request_at = at
            self._idle.clear()
            body = self._handed = self._latest
            self._dispatch(lambda: self._request(body))

    def close(self) -> None:
        """Send the latest state unless it went already (waiting up to the timeout for a request on its way)."""
        self._idle.wait(self._timeout_s)
        if self._latest is not None and self._latest is not self._handed:
            self._handed = self._latest
            self._request(self._latest)

    def _request(self, body: dict[str, Any]) -> None:
        try:
            self._send(self.endpoint, body, self._timeout_s)
        except (OSError, ValueError, http.client.HTTPException) as error:  # a status report never stops training
            self._warn(str(error) or type(error).__name__)
        finally:
            self._idle.set()

    def _warn(self, why: str) -> None:
        with self._lock:
            self._failures += 1
            at = self._clock()
            if self._warned_at is not None and at - self._warned_at < WARN_EVERY_S:
                return
            count = "" if self._failures == 1 else f" ({self._failures} requests failed since the last line)"
            self._warned_at, self._failures = at, 0
        print(
            f"[trainer status] not sent to {self.endpoint.url}: {why}{count}; training goes on",
            file=sys.stderr,
            flush=True,
        )


def reporter(total_steps: int, env: Mapping[str, str] = os.environ) -> TrainerStatusReporter | None:
    """A reporter to the endpoint the Trainer injected into this container; None outside a TrainJob."""
    endpoint = Endpoint.from_env(env)
    return TrainerStatusReporter(endpoint, total_steps) if endpoint else None
