"""The fleet's adapter folder on FSx: a version's adapter published by name, resolved by every vLLM pod.

Every engine of a fleet runs vLLM's filesystem LoRA resolver (VLLM_PLUGINS=lora_filesystem_resolver,
VLLM_LORA_RESOLVER_CACHE_DIR=<the folder>, env from `vllm.engine_env`): asked for an adapter it does not hold, an
engine loads `<folder>/<name>` if that folder's adapter_config.json is a LoRA whose `base_model_name_or_path` is
the engine's own --model, and answers 404 otherwise. So a replica added by scaling, a restarted pod and a new pod
all serve every published adapter without a load call, and an adapter for another base model is refused.

A published name is `<model>-v<version>-<8 hex of the version's MLflow run id>`, and a published folder never
changes: an engine keeps an adapter it resolved for its lifetime, by name, so a name must never come to mean
other weights. The run id keeps two registries' "v1" apart (a wiped local registry, two tests sharing an engine).

Publishing downloads the version's adapter next to the folder, runs the caller's checks on it, stamps the base
model the engine reports as `base_model_name_or_path` (what the resolver compares; training recorded its own
copy's path) and renames it into place: an engine sees the whole adapter or none of it. Unpublishing renames it
away first: from then on no engine can newly resolve it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from eksflow.llm.steps.common import tracking
from eksflow.runtime.args import StepInputError

if TYPE_CHECKING:
    from mlflow.entities.model_registry import ModelVersion

CONFIG = "adapter_config.json"


def published_name(model_name: str, version: str, run_id: str) -> str:
    """The name every engine serves a version's adapter under: `llama-lora-v3-1a2b3c4d` (a folder name, too)."""
    if not re.fullmatch(r"[0-9a-f]{8,}", run_id) or not version.isdigit():
        raise StepInputError(
            f"{model_name} version {version!r} names MLflow run {run_id!r}, not a run id MLflow makes (hex); "
            "register it with eksflow.llm.steps.register"
        )
    return f"{model_name}-v{version}-{run_id[:8]}"


def registered_version(tracking_uri: str, model_name: str, version: str) -> ModelVersion:
    """A registered version; StepInputError naming --model-version when the registry has no such version."""
    from mlflow.exceptions import MlflowException

    tracking.require_registry(tracking_uri)
    with tracking.errors(tracking_uri, f"reading {model_name} version {version}"):
        try:
            return tracking.client(tracking_uri).get_model_version(model_name, version)
        except MlflowException as err:
            if err.error_code not in tracking.NOT_FOUND_CODES:
                raise
    raise StepInputError(
        f"--model-version={version}: {model_name!r} has no version {version} at {tracking_uri}; pass register's "
        "output (tasks.register.outputs.parameters.model_version)"
    )


def fetch(registered: ModelVersion, dest: Path) -> None:
    """Download a registered version's adapter folder to `dest` (which must not exist)."""
    model_name, version = registered.name, registered.version
    if tracking.is_model(registered):
        raise StepInputError(
            f"--model-version={version}: {model_name} version {version} is a whole model (tag "
            f"{tracking.KIND_TAG}=model: train.finetune=full), not an adapter: it is served by a vLLM fleet of its "
            "own, which the rollout of a pipeline with train.finetune=full applies (eksflow.llm.steps.publish_model)"
        )
    download_folder(registered, tracking.ADAPTER_ARTIFACT, CONFIG, dest)


def download_folder(registered: ModelVersion, artifact: str, marker: str, dest: Path) -> None:
    """Download artifact folder `artifact` of a registered version to `dest`, renamed into place whole.

    StepInputError naming the version when the artifact is missing or holds no `marker` file (an adapter's
    adapter_config.json, a model's config.json).
    """
    import mlflow
    from mlflow.exceptions import MlflowException

    model_name, version = registered.name, registered.version
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        try:
            local = Path(
                mlflow.artifacts.download_artifacts(
                    run_id=str(registered.run_id), artifact_path=artifact, dst_path=str(tmp)
                )
            )
        except (MlflowException, OSError) as err:
            raise StepInputError(
                f"--model-version={version}: {model_name} version {version} has no {artifact!r} artifact in run "
                f"{registered.run_id} ({type(err).__name__}); register it with eksflow.llm.steps.register"
            ) from err
        if not (local / marker).is_file():
            raise StepInputError(
                f"--model-version={version}: the {artifact!r} artifact of {model_name} version {version} holds no "
                f"{marker} (missing folder); register the train step's adapter_dir"
            )
        shutil.rmtree(dest, ignore_errors=True)  # a folder left without its marker by a killed step
        os.replace(local, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def download(registered: ModelVersion, folder: Path) -> Path:
    """The version's adapter under `folder/v<version>` (downloaded once: registered versions are immutable)."""
    target = folder / f"v{registered.version}"
    if not (target / CONFIG).is_file():
        shutil.rmtree(target, ignore_errors=True)
        fetch(registered, target)
    return target


def publish(
    tracking_uri: str,
    model_name: str,
    version: str,
    serving_dir: Path,
    served_base: Callable[[], str],
    check: Callable[[Path], None],
) -> str:
    """Publish a version's adapter for the engines whose --model is `served_base()`; returns its published name.

    `check(folder)` raises StepInputError for an adapter this fleet must not serve: nothing is published then, and
    `served_base` (which asks an engine) is not called. Publishing again is a no-op for the same base model folder
    (the checks run again all the same).
    """
    registered = registered_version(tracking_uri, model_name, version)  # read once: name and download
    name = published_name(model_name, version, str(registered.run_id))
    target = serving_dir / name
    base = None
    if (target / CONFIG).is_file():
        check(target)
        base = served_base()
        if _base_of(target) == base:
            return name
    staging = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=_made(serving_dir)))
    try:
        folder = staging / "adapter"
        fetch(registered, folder)
        check(folder)
        config = json.loads((folder / CONFIG).read_text(encoding="utf-8"))
        config["base_model_name_or_path"] = served_base() if base is None else base
        (folder / CONFIG).write_text(json.dumps(config, indent=2), encoding="utf-8")
        unpublish(serving_dir, name)  # published for another base model folder: replaced whole
        os.replace(folder, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return name


def unpublish(serving_dir: Path, name: str) -> bool:
    """Remove a published adapter (renamed away first, so no engine resolves half of it); False if absent."""
    target = serving_dir / name
    if not target.exists():
        return False
    doomed = Path(tempfile.mkdtemp(prefix=f".{name}.gone.", dir=serving_dir))
    os.replace(target, doomed / "adapter")
    shutil.rmtree(doomed, ignore_errors=True)
    return True


def _base_of(folder: Path) -> str:
    """A published folder's base_model_name_or_path ("" when it is not a published adapter)."""
    try:
        return str(json.loads((folder / CONFIG).read_text(encoding="utf-8")).get("base_model_name_or_path", ""))
    except (OSError, ValueError, AttributeError):
        return ""


def _made(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return folder
