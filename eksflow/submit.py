"""`submit`: send the rendered Workflow to an Argo Server through Hera's WorkflowsService, like `argo submit`.

Connection settings follow the argo CLI: ARGO_SERVER (host:port), ARGO_TOKEN (sent verbatim as the Authorization
header; a bare token gets the `Bearer ` prefix), ARGO_NAMESPACE, ARGO_SECURE, ARGO_INSECURE_SKIP_VERIFY and
ARGO_BASE_HREF, each also a flag of the same name.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Mapping
from typing import Any

import requests
from hera.exceptions import HeraException
from hera.workflows import WorkflowsService
from hera.workflows import models as m
from rich.console import Console

DONE = ("Succeeded", "Failed", "Error")
POLL_S = 5.0
EXPLAIN = {
    401: "the server refused the token; set ARGO_TOKEN to the output of `argo auth token` (or a service account token)",
    403: "the token's service account may not create workflows in this namespace; check its Role",
    404: "no such namespace or API path; check ARGO_NAMESPACE and ARGO_BASE_HREF",
    409: "a workflow with this name already exists; submit again (generateName picks a new name) or delete it",
}


class SubmitError(Exception):
    """A submission the server refused or could not take; one line saying what to fix."""


def server_url(server: str, *, secure: bool, base_href: str = "") -> str:
    """`host:port` (as ARGO_SERVER holds it) -> `https://host:port/<base href>/`."""
    if not server:
        raise SubmitError("no Argo Server: set ARGO_SERVER=host:port or pass --argo-server")
    url = server if "://" in server else f"{'https' if secure else 'http'}://{server}"
    href = base_href.strip("/")
    return url.rstrip("/") + "/" + (f"{href}/" if href else "")


def service(options: argparse.Namespace, session: requests.Session) -> WorkflowsService:
    """A WorkflowsService configured from the argo CLI's flags and environment variables."""
    return WorkflowsService(
        host=server_url(options.argo_server, secure=options.secure, base_href=options.argo_base_href),
        verify_ssl=not options.insecure_skip_verify,
        token=os.environ.get("ARGO_TOKEN") or None,
        namespace=options.namespace,
        session=session,
    )


def submit(manifest: Mapping[str, Any], options: argparse.Namespace, console: Console) -> int:
    """Create the workflow, print its UI link, and with --watch follow its nodes until it finishes."""
    namespace = options.namespace or manifest["metadata"].get("namespace") or "argo"
    options.namespace = namespace
    responses: list[requests.Response] = []
    session = requests.Session()
    session.hooks["response"].append(lambda response, *_, **__: responses.append(response))
    workflows = service(options, session)
    request = m.WorkflowCreateRequest(namespace=namespace, workflow=m.Workflow.model_validate(dict(manifest)))
    created = _call(lambda: workflows.create_workflow(request, namespace=namespace), responses, workflows.host)
    name = created.metadata.name or ""
    console.print(f"submitted {namespace}/{name}: {workflows.host}workflows/{namespace}/{name}", soft_wrap=True)
    if not options.watch:
        return 0
    seen: dict[str, str] = {}
    while True:
        workflow = _call(lambda: workflows.get_workflow(name, namespace=namespace), responses, workflows.host)
        status = workflow.status
        for node in (status.nodes or {}).values() if status else ():
            label = node.display_name or node.name or node.id
            if node.type == "Pod" and seen.get(node.id) != node.phase:
                seen[node.id] = node.phase or ""
                console.print(f"  {label}: {node.phase}" + (f" ({node.message})" if node.message else ""))
        phase = status.phase if status else None
        if phase in DONE:
            console.print(f"workflow {name} {phase}" + (f": {status.message}" if status and status.message else ""))
            return 0 if phase == "Succeeded" else 1
        time.sleep(POLL_S)


def _call(action: Any, responses: list[requests.Response], host: str) -> Any:
    """Run one API call; turn a refused or failed request into a one-line SubmitError."""
    try:
        return action()
    except requests.exceptions.SSLError as err:
        raise SubmitError(f"TLS to {host} failed ({err}); use --insecure-skip-verify or ARGO_SECURE=false") from None
    except requests.exceptions.ConnectionError:
        raise SubmitError(f"cannot reach the Argo Server at {host}; check ARGO_SERVER and port-forwarding") from None
    except (HeraException, KeyError, ValueError):
        response = responses[-1] if responses else None
        if response is None or response.ok:  # not an HTTP error: a bug worth its traceback
            raise
        code = response.status_code
        message = _server_message(response)
        hint = EXPLAIN.get(code) or ("the Argo Server failed; retry, then check its logs" if code >= 500 else "")
        raise SubmitError(f"HTTP {code} from {host}: {message}" + (f"; {hint}" if hint else "")) from None


def _server_message(response: requests.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text.strip().splitlines()[0][:200] if response.text.strip() else response.reason
    return str(body.get("message", body))[:200] if isinstance(body, dict) else str(body)[:200]


def add_connection_options(command: argparse.ArgumentParser) -> None:
    """The argo CLI's connection flags, each defaulting to its environment variable."""
    command.add_argument("--argo-server", default=os.environ.get("ARGO_SERVER", ""), help="host:port ($ARGO_SERVER)")
    command.add_argument("-n", "--namespace", default=os.environ.get("ARGO_NAMESPACE"), help="($ARGO_NAMESPACE)")
    command.add_argument(
        "-k",
        "--insecure-skip-verify",
        action="store_true",
        default=os.environ.get("ARGO_INSECURE_SKIP_VERIFY") == "true",
        help="do not verify the server's certificate ($ARGO_INSECURE_SKIP_VERIFY=true)",
    )
    command.add_argument(
        "-e",
        "--secure",
        action=argparse.BooleanOptionalAction,
        default=os.environ.get("ARGO_SECURE", "true") != "false",
        help="use TLS (default; $ARGO_SECURE=false for plain http)",
    )
    command.add_argument("--argo-base-href", default=os.environ.get("ARGO_BASE_HREF", ""), help="($ARGO_BASE_HREF)")
