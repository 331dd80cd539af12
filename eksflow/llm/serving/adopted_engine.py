"""An engine already running on this machine that a run's vLLM Deployment adopts instead of starting its own.

$EKSFLOW_VLLM_URL (e.g. a test session's engine): the vLLM Deployment adopts it after checking that it serves the
same base model folder; it is not stopped with the run. Its API key is $EKSFLOW_VLLM_API_KEY, its adapter folder
$EKSFLOW_VLLM_ADAPTERS: the run's adapter folder becomes a link to it (adapters already published there move into
it first), so what the run's steps publish is what the engine resolves.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from eksflow.llm.serving import fleet_pods
from eksflow.llm.serving.fleet_pods import FleetError

ADOPT_ENV = "EKSFLOW_VLLM_URL"  # an engine already running here that the run uses instead of its own
ADOPT_KEY_ENV = "EKSFLOW_VLLM_API_KEY"
ADOPT_ADAPTERS_ENV = "EKSFLOW_VLLM_ADAPTERS"  # the adopted engine's adapter folder (VLLM_LORA_RESOLVER_CACHE_DIR)
RESOLVER_DIR_ENV = "VLLM_LORA_RESOLVER_CACHE_DIR"


def adopted_url() -> str:
    """The engine to adopt ($EKSFLOW_VLLM_URL), "" when the run starts its own."""
    return os.environ.get(ADOPT_ENV, "").rstrip("/")


def adopted_port() -> int:
    """The adopted engine's port (its URL's)."""
    return int(adopted_url().rsplit(":", 1)[1])


def adopted_key() -> str:
    """The adopted engine's API key."""
    return os.environ.get(ADOPT_KEY_ENV, "")


def served_model(base: str, api_key: str, wanted: str, where: str) -> str:
    """The adopted engine's served base model name once it answers /v1/models ("" while it does not answer).

    FleetError if it serves another base model folder than the Deployment's `wanted`.
    """
    models = fleet_pods.models(base, api_key)
    if models is None:
        return ""  # still starting, like a pod that is not ready yet
    card = next((m for m in models if not m.get("parent")), None)
    served = str((card or {}).get("root", ""))
    if Path(served).resolve() != Path(wanted).resolve():
        raise FleetError(
            f"{where}: {ADOPT_ENV}={base} serves {served!r}, the Deployment wants {wanted!r}; unset "
            f"{ADOPT_ENV} to start this run's own engine",
            retriable=False,
        )
    return str((card or {}).get("id", ""))


def share_adapters(run_folder: str, where: str) -> None:
    """Make the run's adapter folder a link to the adopted engine's ($EKSFLOW_VLLM_ADAPTERS)."""
    engine_folder = Path(os.environ.get(ADOPT_ADAPTERS_ENV, ""))
    if not run_folder or not os.environ.get(ADOPT_ADAPTERS_ENV) or not engine_folder.is_dir():
        raise FleetError(
            f"{where}: adopting ${ADOPT_ENV} needs ${ADOPT_ADAPTERS_ENV}, the engine's adapter folder "
            f"({RESOLVER_DIR_ENV}), and the Deployment's {RESOLVER_DIR_ENV}; unset {ADOPT_ENV} to start the run's "
            "own engine",
            retriable=False,
        )
    folder = Path(run_folder)
    if folder.is_symlink() and folder.resolve() == engine_folder.resolve():
        return
    if folder.is_dir() and not folder.is_symlink():
        for published in folder.iterdir():
            if not (engine_folder / published.name).exists():
                os.replace(published, engine_folder / published.name)
        shutil.rmtree(folder)
    folder.unlink(missing_ok=True)
    folder.parent.mkdir(parents=True, exist_ok=True)
    folder.symlink_to(engine_folder.resolve(), target_is_directory=True)
