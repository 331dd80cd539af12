"""A Service's endpoints as the local fleet keeps them for the run's steps: the EndpointSliceList the API would give.

On a cluster the endpoints controller keeps each Service's EndpointSlices: an endpoint for each pod its selector
picks, with the pod's address, its node and whether it is ready (a pod that ends or whose node goes is taken out).
The rollout steps list them to address every replica on its own (eksflow/llm/steps/common/replicas.py). Here the
local fleet writes the same document into the run folder, fleet/endpoints/<service>.json, whenever one of the
Service's pods starts, becomes ready, ends or goes with its node: in one rename, so a step reads the list from
before a change or from after it, never half of one.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eksflow.llm.steps.common.replicas import SERVICE_LABEL, endpoints_file
from eksflow.runtime.outputs import atomic_write_text

API_VERSION = "discovery.k8s.io/v1"


@dataclass(frozen=True)
class Endpoint:
    """One pod a Service selects: its name, its node, its address and port, whether it is ready."""

    pod: str
    node: str
    address: str
    port: int
    ready: bool


def slice_list(service: str, port_name: str, endpoints: Sequence[Endpoint]) -> dict[str, Any]:
    """The EndpointSliceList of Service `service`: one slice per port its pods listen on (one for a Deployment)."""
    ports = sorted({e.port for e in endpoints})
    items = [
        {
            "apiVersion": API_VERSION,
            "kind": "EndpointSlice",
            "metadata": {"name": f"{service}-{port}", "labels": {SERVICE_LABEL: service}},
            "addressType": "IPv4",
            "ports": [{"name": port_name, "port": port, "protocol": "TCP"}],
            "endpoints": [
                {
                    "addresses": [e.address],
                    "conditions": {"ready": e.ready, "serving": e.ready, "terminating": False},
                    "nodeName": e.node,
                    "targetRef": {"kind": "Pod", "name": e.pod},
                }
                for e in sorted(endpoints, key=lambda e: e.pod)
                if e.port == port
            ],
        }
        for port in ports
    ]
    return {"apiVersion": API_VERSION, "kind": "EndpointSliceList", "items": items}


def write(run_dir: Path, service: str, port_name: str, endpoints: Sequence[Endpoint]) -> None:
    """Replace Service `service`'s endpoints in the run folder, in one rename."""
    path = endpoints_file(run_dir, service)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(slice_list(service, port_name, endpoints), indent=2))
