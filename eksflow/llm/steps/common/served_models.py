"""The fleet's model folder on FSx: a whole-model version (train.finetune=full) published for a vLLM fleet of its own.

An adapter joins its base model's engine (adapters.py); a whole model cannot: each is served by a Deployment and
Service of its own, `<pipeline>-vllm-<8 hex of its published name>` (prepare_fleet.fleet_name's form, so the proxy's
upstream pattern and the fleet's NetworkPolicy cover it), whose engine loads the published folder under the same
name adapters get, `<model>-v<version>-<8 hex of its run id>`. A published folder never changes (registered versions
are immutable), so an engine started on it, now or after a restart, serves the same weights; publishing downloads
the version's "model" artifact next to the folder and renames it into place, so an engine sees all of it or none.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from eksflow.llm.steps.common import tracking
from eksflow.llm.steps.common.adapters import download_folder, published_name
from eksflow.llm.steps.common.fleet_names import fleet_name
from eksflow.llm.steps.common.trained import MODEL_CONFIG

if TYPE_CHECKING:
    from mlflow.entities.model_registry import ModelVersion


def model_fleet(pipeline: str, published: str) -> str:
    """The Deployment and Service serving published model `published`: one per model version, named as fleets are."""
    return fleet_name(pipeline, f"models:/{published}")


def publish(registered: ModelVersion, models_dir: Path) -> tuple[str, Path]:
    """Publish a whole-model version under `models_dir` (once); its published name and folder.

    StepInputError when the version has no "model" artifact holding a model's config.json.
    """
    name = published_name(registered.name, str(registered.version), str(registered.run_id))
    target = models_dir / name
    if not (target / MODEL_CONFIG).is_file():
        download_folder(registered, tracking.MODEL_ARTIFACT, MODEL_CONFIG, target)
    return name, target
