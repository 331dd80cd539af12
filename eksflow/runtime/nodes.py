"""What a step knows of the nodes: the one it runs on, and those known to be gone with everything on them.

On Kubernetes a pod learns its node from the downward API (`NODE_NAME` from `spec.nodeName`). The local executor's
simulated nodes (eksflow/local/sim_nodes.py) set it in every pod they start, and name in $EKSFLOW_LOST_NODES_FILE a
file listing each node lost so far, written once every process of the node has been killed: a process recorded
as running on such a node is known dead, where one on another host could otherwise only be waited out (a lease's
heartbeat, eksflow.llm.steps.common.lease). Where no file is named, no node is known lost.
"""

from __future__ import annotations

import os
from pathlib import Path

NODE_NAME_ENV = "NODE_NAME"
LOST_NODES_ENV = "EKSFLOW_LOST_NODES_FILE"


def this_node() -> str:
    """The node this process runs on; "" where the platform does not say."""
    return os.environ.get(NODE_NAME_ENV, "")


def lost_nodes() -> frozenset[str]:
    """The nodes known to be lost, each with every process it ran; empty where nothing says."""
    record = os.environ.get(LOST_NODES_ENV, "")
    if not record:
        return frozenset()
    try:
        return frozenset(line.strip() for line in Path(record).read_text(encoding="utf-8").splitlines() if line.strip())
    except OSError:
        return frozenset()
