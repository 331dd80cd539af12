"""What the train step's output folder holds: a LoRA adapter (train.finetune=lora) or a whole model (full).

Evaluate scores either, register logs and tags either; both tell them apart by the folder's own files, as
`from_pretrained` does: an adapter has peft's adapter_config.json, a model transformers' config.json.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Literal

from eksflow.llm.steps.common.adapter_digest import ADAPTER_CONFIG
from eksflow.runtime.args import StepInputError

ModelKind = Literal["adapter", "model"]
MODEL_CONFIG = "config.json"


def model_kind(folder: Path, field: str) -> ModelKind:
    """Whether the folder the train step wrote is an adapter or a model; anything else is refused naming `field`."""
    if (folder / ADAPTER_CONFIG).is_file():
        return "adapter"
    if (folder / MODEL_CONFIG).is_file():
        return "model"
    raise StepInputError(
        f"{field}={folder}: neither a LoRA adapter ({ADAPTER_CONFIG}) nor a model ({MODEL_CONFIG}) there; did the "
        "train step finish? (tasks.train.outputs.parameters.adapter_dir)"
    )


def model_digest(folder: Path) -> str:
    """sha256 over a model folder's files (weights, config, generation config, tokenizer): names and bytes, by name.

    The train step writes each from the weights and the base alone, so the same weights give the same digest.
    """
    h = hashlib.sha256()
    for path in sorted(p for p in folder.iterdir() if p.is_file()):
        h.update(path.name.encode() + b"\0")
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()
