"""Process helpers of the e2e tests: the serving processes a run left behind."""

from __future__ import annotations

import os
from pathlib import Path

ENGINE_MODULE = "vllm.entrypoints.openai.api_server"
WORKER_ENV = "PYTEST_XDIST_WORKER"


def serving_processes() -> set[int]:
    """Pids of live vLLM (server, engine core, workers: they retitle themselves VLLM::...) and LiteLLM processes
    this pytest worker's tests started.

    Every process a test starts inherits the worker's name in its environment, an orphan too: the other worker's
    tests (a proxy on simulated nodes, say) run their own serving processes meanwhile, which are not this one's.
    """
    worker = os.environ.get(WORKER_ENV, "").encode()
    found = set()
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
            environ = (cmdline.parent / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if worker and f"{WORKER_ENV}=".encode() + worker not in environ:
            continue
        if text.startswith("VLLM::") or ENGINE_MODULE in text or "bin/litellm" in text:
            found.add(int(cmdline.parent.name))
    return found
