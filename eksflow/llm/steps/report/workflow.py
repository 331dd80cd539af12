"""Where the report's Workflow comes from: the local run folder, or the Kubernetes API with the pod's account.

Both give one plain dict shaped like the Workflow object (`metadata`, `spec`, `status`), normalised so the
collector reads one form: a workflow started from a WorkflowTemplate gets the stored template's spec, and
`status.compressedNodes` (what the controller writes for a large workflow) is unpacked into `status.nodes`.
"""

from __future__ import annotations

import base64
import gzip
import json
import posixpath
import urllib.parse
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from eksflow.errors import EXIT_FAILED
from eksflow.llm.steps.common.kube_api import ApiAccess, KubeApiError, get_json
from eksflow.runtime.rundir import MANIFEST_FILE, STATUS_FILE

API_GROUP = "/apis/argoproj.io/v1alpha1"

Workflow = dict[str, Any]


class WorkflowUnavailableError(KubeApiError):
    """The Workflow could not be read (API down, no permission, no run folder); retryable, one line."""

    label = "workflow unavailable"
    exit_code = EXIT_FAILED  # retried: the API or the run folder may be back


def fetch_workflow(name: str, access: ApiAccess) -> Workflow:
    """GET the Workflow object `name` from the API (needs `get` on workflows.argoproj.io in its namespace)."""
    path = f"{API_GROUP}/namespaces/{urllib.parse.quote(access.namespace)}/workflows/{urllib.parse.quote(name)}"
    try:
        body = get_json(access, path)
    except KubeApiError as err:
        if not err.status:
            raise WorkflowUnavailableError(f"GET workflow {name!r} from {access.base_url}: {err}") from err
        hint = {
            403: "grant the pipeline's Role `get` on workflows (workflow-templates/cluster-prerequisites.yaml)",
            404: "the workflow is gone (deleted, or another namespace)",
        }.get(err.status, "check the API server")
        raise WorkflowUnavailableError(
            f"GET workflow {name!r} in {access.namespace!r}: HTTP {err.status}; {hint}", err.status
        ) from err
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
