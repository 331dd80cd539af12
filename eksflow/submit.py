"""`submit`: send the rendered Workflow to an Argo Server, like `argo submit`.

Connection settings follow the argo CLI: ARGO_SERVER (host:port), ARGO_TOKEN (sent verbatim as the Authorization
header; a bare token gets the `Bearer ` prefix), ARGO_NAMESPACE, ARGO_SECURE, ARGO_INSECURE_SKIP_VERIFY and
ARGO_BASE_HREF, each also a flag of the same name. Every answer other than the created Workflow (an error status,
HTML from a proxy, `{}`, no answer within the timeouts) ends in one SubmitError line: see eksflow.argo_client; a
setting that cannot work is an ArgoSettingError (bad input). What the server answers is printed through
eksflow.runtime.shown: names and messages cannot carry terminal escapes or rich markup, nor show a token.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Mapping
from typing import Any

import requests
from rich.console import Console

from eksflow.argo_client import ArgoServer, ArgoServerError, ArgoSettingError, server_url, workflow_object
from eksflow.runtime.shown import shown

__all__ = ["DONE", "POLL_S", "ArgoSettingError", "SubmitError", "server_url", "submit"]

DONE = ("Succeeded", "Failed", "Error")
POLL_S = 5.0

# What the CLI catches: every refused or failed request is one line (eksflow.argo_client explains each kind).
SubmitError = ArgoServerError


def submit(manifest: Mapping[str, Any], options: argparse.Namespace, console: Console) -> int:
    """Create the workflow, print its UI link, and with --watch follow its nodes until it finishes."""
    namespace = options.namespace or manifest["metadata"].get("namespace") or "argo"
    options.namespace = namespace
    server = ArgoServer.from_options(options)
    with requests.Session() as session:
        body = {"namespace": namespace, "workflow": dict(manifest)}
        answer = server.call("POST", f"workflows/{namespace}", body=body, session=session)
        name = workflow_object(answer, server.url, "the submission")["metadata"]["name"]
        link = f"{server.url}workflows/{namespace}/{name}"
        console.print(f"submitted {shown(f'{namespace}/{name}')}: {shown(link)}", markup=False, soft_wrap=True)
        if not options.watch:
            return 0
        seen: dict[str, str] = {}
        while True:
            answer = server.call("GET", f"workflows/{namespace}/{name}", session=session)
            status = workflow_object(answer, server.url, f"GET of workflow {name}").get("status") or {}
            nodes = status.get("nodes") or {}
            for node_id, node in nodes.items() if isinstance(nodes, dict) else ():
                label = node.get("displayName") or node.get("name") or node_id
                if node.get("type") == "Pod" and seen.get(node_id) != node.get("phase"):
                    seen[node_id] = node.get("phase") or ""
                    message = node.get("message")
                    line = f"  {label}: {node.get('phase')}" + (f" ({message})" if message else "")
                    console.print(shown(line), markup=False, highlight=False, soft_wrap=True)
            phase = status.get("phase")
            if phase in DONE:
                message = status.get("message")
                line = f"workflow {name} {phase}" + (f": {message}" if message else "")
                console.print(shown(line), markup=False, highlight=False, soft_wrap=True)
                return 0 if phase == "Succeeded" else 1
            time.sleep(POLL_S)


def add_connection_options(command: argparse.ArgumentParser) -> None:
    """The argo CLI's connection flags (read by ArgoServer.from_options), each defaulting to its variable."""
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
