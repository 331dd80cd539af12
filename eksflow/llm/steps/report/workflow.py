"""Where the report's Workflow comes from: the local run folder, or the Kubernetes API with the pod's account.

Both give one plain dict shaped like the Workflow object (`metadata`, `spec`, `status`), normalised so the
collector reads one form: a workflow started from a WorkflowTemplate gets the stored template's spec, and
`status.compressedNodes` (what the controller writes for a large workflow) is unpacked into `status.nodes`.
"""

from __future__ import annotations

import base64
import gzip
import json
import os
import posixpath
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from eksflow.errors import EXIT_FAILED
from eksflow.runtime.args import StepFailedError
from eksflow.runtime.rundir import MANIFEST_FILE, STATUS_FILE

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
API_TIMEOUT_S = 20.0
API_GROUP = "/apis/argoproj.io/v1alpha1"

Workflow = dict[str, Any]


class WorkflowUnavailableError(StepFailedError):
    """The Workflow could not be read (API down, no permission, no run folder); retryable, one line."""

    label = "workflow unavailable"
    exit_code = EXIT_FAILED


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
            raise WorkflowUnavailableError(
                "neither $EKSFLOW_RUN_DIR (a local run) nor $KUBERNETES_SERVICE_HOST (a pod) is set: no workflow to "
                "read; run the report task inside a workflow"
            )
        port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        authority = f"[{host}]" if ":" in host else host  # an IPv6 service address
        try:
            token = (account_dir / "token").read_text(encoding="utf-8").strip()
            namespace = (account_dir / "namespace").read_text(encoding="utf-8").strip()
        except OSError as err:
            raise WorkflowUnavailableError(
                f"cannot read the service account in {account_dir}: {err}; keep automountServiceAccountToken on for "
                "the report task"
            ) from err
        return cls(f"https://{authority}:{port}", token, namespace, str(account_dir / "ca.crt"))


def fetch_workflow(name: str, access: ApiAccess) -> Workflow:
    """GET the Workflow object `name` from the API (needs `get` on workflows.argoproj.io in its namespace)."""
    path = f"{API_GROUP}/namespaces/{urllib.parse.quote(access.namespace)}/workflows/{urllib.parse.quote(name)}"
    request = urllib.request.Request(
        access.base_url + path, headers={"Authorization": f"Bearer {access.token}", "Accept": "application/json"}
    )
    context = ssl.create_default_context(cafile=access.cafile) if access.base_url.startswith("https:") else None
    try:
        with urllib.request.urlopen(request, timeout=API_TIMEOUT_S, context=context) as response:
            body = json.loads(response.read().decode("utf-8"))
    except urllib.error.HTTPError as err:
        hint = {
            403: "grant the pipeline's Role `get` on workflows (workflow-templates/cluster-prerequisites.yaml)",
            404: "the workflow is gone (deleted, or another namespace)",
        }.get(err.code, "check the API server")
        raise WorkflowUnavailableError(
            f"GET workflow {name!r} in {access.namespace!r}: HTTP {err.code}; {hint}"
        ) from err
    except (urllib.error.URLError, OSError, ValueError) as err:
        raise WorkflowUnavailableError(f"GET workflow {name!r} from {access.base_url}: {err}") from err
    if not isinstance(body, dict) or body.get("kind") != "Workflow":
        raise WorkflowUnavailableError(f"GET workflow {name!r}: the answer is not a Workflow object")
    return normalise(body)


def read_local(run_dir: Path) -> Workflow:
    """The Workflow of a local run: the manifest as compiled, with the executor's status.json."""
    try:
        manifest = yaml.safe_load((run_dir / MANIFEST_FILE).read_text(encoding="utf-8"))
        saved = json.loads((run_dir / STATUS_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError, yaml.YAMLError) as err:
        raise WorkflowUnavailableError(f"cannot read the run folder {run_dir}: {err}") from err
    if not isinstance(manifest, dict) or not isinstance(saved, dict):
        raise WorkflowUnavailableError(f"{run_dir}: {MANIFEST_FILE} and {STATUS_FILE} must each hold one object")
    metadata = {**manifest.get("metadata", {}), **saved.get("metadata", {})}
    spec = dict(manifest.get("spec", {}))
    arguments = saved.get("spec", {}).get("arguments")
    if arguments:
        spec["arguments"] = arguments  # the values this run used (after overrides)
    return normalise({"metadata": metadata, "spec": spec, "status": saved.get("status", {})})


def normalise(workflow: Mapping[str, Any]) -> Workflow:
    """One form for the collector: the stored template spec merged in, compressed nodes unpacked."""
    result: Workflow = {key: workflow.get(key) or {} for key in ("metadata", "spec", "status")}
    status = dict(result["status"])
    stored = status.get("storedWorkflowTemplateSpec")
    if isinstance(stored, dict):
        # Submitted from a WorkflowTemplate: the object's spec holds only the reference and overrides.
        own = {k: v for k, v in result["spec"].items() if k != "workflowTemplateRef" and v not in (None, {}, [])}
        result["spec"] = {**stored, **own}
    compressed = status.get("compressedNodes")
    if not status.get("nodes") and isinstance(compressed, str) and compressed:
        try:
            status["nodes"] = json.loads(gzip.decompress(base64.b64decode(compressed)))
        except (ValueError, OSError) as err:
            raise WorkflowUnavailableError(f"status.compressedNodes cannot be unpacked: {err}") from err
    result["status"] = status
    return result


def host_paths(workflow: Mapping[str, Any], run_dir: Path) -> Callable[[str], str]:
    """Container path -> the host path the local executor mapped it to (identity for paths on no volume).

    Mirrors the executor's layout: a PersistentVolumeClaim lives in `<state dir>/volumes/<claim>` (shared by
    runs), any other volume in `<run dir>/volumes/<name>`; a mount's subPath is a folder below that.
    """
    spec = workflow.get("spec", {})
    volumes: dict[str, Path] = {}
    for volume in spec.get("volumes") or []:
        claim = (volume.get("persistentVolumeClaim") or {}).get("claimName")
        name = str(volume.get("name", ""))
        volumes[name] = run_dir.parent.parent / "volumes" / claim if claim else run_dir / "volumes" / name
    prefixes: dict[str, Path] = {}
    for template in spec.get("templates") or []:
        for mount in (template.get("container") or {}).get("volumeMounts") or []:
            root = volumes.get(str(mount.get("name", "")))
            mount_path = str(mount.get("mountPath", "")).rstrip("/")
            if root is not None and mount_path.startswith("/"):
                prefixes[mount_path] = root / mount["subPath"] if mount.get("subPath") else root
    ordered = sorted(prefixes.items(), key=lambda item: len(item[0]), reverse=True)  # the deepest mount wins

    def to_host(path: str) -> str:
        normal = posixpath.normpath(path) if path else path
        for prefix, host in ordered:
            if normal == prefix or normal.startswith(prefix + "/"):
                return str(host / normal[len(prefix) :].lstrip("/"))
        return path

    return to_host
