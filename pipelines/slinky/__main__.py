"""`python -m pipelines.slinky [-o FILE] [--config FILE] [--set k=v ...]`: the flagship's Slinky objects as YAML."""

from __future__ import annotations

from eksflow.launchers.slinky import objects
from pipelines._gitops import write_objects
from pipelines.llama_lora import LlamaLoraConfig

if __name__ == "__main__":
    raise SystemExit(write_objects("python -m pipelines.slinky", LlamaLoraConfig, objects, None))
