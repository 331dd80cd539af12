"""The Kubernetes API as a step's pod reaches it: the pod's service account, and one GET of an object or a list.

Two steps read cluster objects, each from the local run folder when the local executor runs it ($EKSFLOW_RUN_DIR)
and from here in a pod: the report its own Workflow (report/workflow.py), the rollout steps the fleet Service's
EndpointSlices (replicas.py). What each may read, the pipeline's Role grants (workflow-templates/
cluster-prerequisites.yaml).
"""

from __future__ import annotations

import json
import os
import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eksflow.errors import EXIT_FAILED
from eksflow.runtime.args import StepFailedError

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
API_TIMEOUT_S = 20.0


class KubeApiError(StepFailedError):
    """The API could not be asked or refused (no pod account, HTTP error, no answer); retryable, one line.

    `status` is the HTTP status of a refusal (403: the Role lacks the permission), 0 when nothing answered.
    """

    label = "kubernetes api error"
    exit_code = EXIT_FAILED

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class ApiAccess:
    """How to reach the Kubernetes API: base URL, bearer token, CA bundle (None: the system's), namespace."""

    base_url: str
    token: str
    namespace: str
    cafile: str | None = None

    @classmethod
    def in_cluster(cls, account_dir: Path = SERVICE_ACCOUNT_DIR) -> ApiAccess:
        """The pod's service account, as every in-cluster client finds it."""
        host = os.environ.get("KUBERNETES_SERVICE_HOST", "")
        if not host:
            raise KubeApiError(
                "neither $EKSFLOW_RUN_DIR (a local run) nor $KUBERNETES_SERVICE_HOST (a pod) is set: no cluster to "
                "read from; run the task inside a workflow"
            )
        port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        authority = f"[{host}]" if ":" in host else host  # an IPv6 service address
        try:
            token = (account_dir / "token").read_text(encoding="utf-8").strip()
            namespace = (account_dir / "namespace").read_text(encoding="utf-8").strip()
        except OSError as err:
            raise KubeApiError(
                f"cannot read the service account in {account_dir}: {err}; keep automountServiceAccountToken on for "
                "the task"
            ) from err
        return cls(f"https://{authority}:{port}", token, namespace, str(account_dir / "ca.crt"))


def get_json(access: ApiAccess, path: str) -> Any:
    """GET `path` (with its query) from the API, as JSON; KubeApiError with the HTTP status when refused."""
    request = urllib.request.Request(
        access.base_url + path, headers={"Authorization": f"Bearer {access.token}", "Accept": "application/json"}
    )
    context = ssl.create_default_context(cafile=access.cafile) if access.base_url.startswith("https:") else None
    try:
        with urllib.request.urlopen(request, timeout=API_TIMEOUT_S, context=context) as response:
            return json.loads(response.read().decode("utf-8"))
    except urllib.error.HTTPError as err:
        raise KubeApiError(f"HTTP {err.code}", status=err.code) from err
    except (urllib.error.URLError, OSError, ValueError) as err:
        raise KubeApiError(str(err)) from err
