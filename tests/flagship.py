"""The flagship pipeline as tests build it: its config, its Pipeline and its manifest, from `--set`-style overrides."""

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from eksflow.config import load_config
from eksflow.pipeline import Pipeline
from eksflow.render import manifest
from pipelines.llama_lora import LlamaLoraConfig, build


def config(overrides: Sequence[str] = (), path: Path | None = None) -> LlamaLoraConfig:
    return load_config(LlamaLoraConfig, path, overrides)


def pipeline(overrides: Sequence[str] = ()) -> Pipeline:
    return build(config(overrides))


def rendered(overrides: Sequence[str] = ()) -> dict[str, Any]:
    return manifest(pipeline(overrides))
