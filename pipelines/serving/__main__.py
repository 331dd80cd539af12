"""`python -m pipelines.serving [-o FILE] [--config FILE] [--set k=v ...]`: the flagship's serving objects as YAML."""

from __future__ import annotations

from eksflow.llm.serving.rollout import gitops_objects
from pipelines._gitops import write_objects
from pipelines.llama_lora import LlamaLoraConfig

if __name__ == "__main__":
    raise SystemExit(write_objects("python -m pipelines.serving", LlamaLoraConfig, gitops_objects, None))
