"""`python -m pipelines.topology [-o FILE] [--config FILE] [--set k=v ...]`: the flagship's Kueue Topology as YAML."""

from __future__ import annotations

from eksflow.topology import objects
from pipelines._gitops import write_objects
from pipelines.llama_lora import LlamaLoraConfig

if __name__ == "__main__":
    raise SystemExit(write_objects("python -m pipelines.topology", LlamaLoraConfig, objects, None))
