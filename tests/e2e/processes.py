"""Process helpers of the e2e tests: the serving processes a run left behind."""

from __future__ import annotations

from pathlib import Path

ENGINE_MODULE = "vllm.entrypoints.openai.api_server"


def serving_processes() -> set[int]:
    """Pids of live vLLM (server, engine core, workers: they retitle themselves VLLM::...) and LiteLLM processes."""
    found = set()
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text.startswith("VLLM::") or ENGINE_MODULE in text or "bin/litellm" in text:
            found.add(int(cmdline.parent.name))
    return found
