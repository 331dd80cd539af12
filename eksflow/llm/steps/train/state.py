"""Checkpoint contents: full (unsharded) trained weights and optimizer state by parameter name, scheduler, RNG, step.

The weights are the adapter (peft's folder, `adapter/`) or, with train.finetune=full, the whole model (`model/`:
safetensors, config.json, generation_config.json and the base's tokenizer files, what `from_pretrained` and vLLM
load); a resumed full fine-tune loads its model from that folder.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from eksflow.runtime.args import StepInputError

STATE_FILE = "trainer_state.pt"
METRICS_FILE = "metrics.json"  # the last logging window's metrics, saved with each checkpoint
ADAPTER_FOLDER = "adapter"
MODEL_FOLDER = "model"


def trained_folder(checkpoint: Path, finetune: str) -> Path:
    """Where `checkpoint` holds what trained: the adapter folder (lora) or the whole model's folder (full)."""
    return checkpoint / (MODEL_FOLDER if finetune == "full" else ADAPTER_FOLDER)


def _unwrap(model: Any) -> Any:
    return model.module if hasattr(model, "module") else model


def full_state(model: Any, optimizer: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """Trainable weights and optimizer state, unsharded on CPU and keyed by parameter name; empty off rank 0.

    A collective under FSDP: every rank calls it at the same step.
    """
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    options = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=True)
    return get_model_state_dict(model, options=options), get_optimizer_state_dict(model, optimizer, options=options)


def save_checkpoint(
    folder: Path,
    rank: int,
    model: Any,
    weights: dict[str, Any],
    optimizer_state: dict[str, Any],
    scheduler: Any,
    strategy: str,
    metrics: dict[str, float],
    base_dir: str = "",
) -> None:
    """Write one checkpoint's files into `folder` (rank 0 only; checkpoints.commit makes it visible).

    `weights`: the trainable weights by parameter name (the adapter's, or every weight of a full fine-tune, whose
    model folder gets the tokenizer of the base in `base_dir`).
    """
    import torch

    if rank != 0:  # per-rank files would collide (docs/reliability.md): rank 0 holds the gathered full state
        raise RuntimeError(f"rank {rank} tried to write checkpoint {folder}; only rank 0 writes checkpoints")
    (folder / METRICS_FILE).write_text(json.dumps(metrics), encoding="utf-8")
    if base_dir:
        save_model(folder / MODEL_FOLDER, _unwrap(model), weights, base_dir)
    else:
        # PEFT picks the adapter's tensors out of the full state and names them as evaluate and register expect.
        _unwrap(model).save_pretrained(folder / ADAPTER_FOLDER, safe_serialization=True, state_dict=weights)
    torch.save(
        {
            "step": int(metrics["step"]),
            "strategy": strategy,
            "optimizer": optimizer_state,
            "scheduler": scheduler.state_dict(),
            "torch_rng": torch.get_rng_state(),
            "python_rng": random.getstate(),
            # The training device's stream only: a checkpoint must resume where fewer GPUs are visible (an MPI rank
            # sees the node's every GPU; a Ray GPU worker, one).
            "cuda_rng": torch.cuda.get_rng_state() if torch.cuda.is_available() else None,
        },
        folder / STATE_FILE,
    )


def save_model(folder: Path, model: Any, weights: dict[str, Any], base_dir: str) -> None:
    """A model folder: `weights` as one safetensors file, the model's config and generation config, the tokenizer.

    Written from the gathered state, not by `save_pretrained`, which reads the (sharded) parameters; the tokenizer
    is the base's in `base_dir`.
    """
    from safetensors.torch import save_file
    from transformers import AutoTokenizer

    folder.mkdir()
    stored: dict[str, Any] = {}
    shared: set[int] = set()
    for name, tensor in weights.items():  # tied weights (embeddings and output head) share a tensor: store it once
        if tensor.data_ptr() not in shared:
            shared.add(tensor.data_ptr())
            stored[name] = tensor.contiguous()
    save_file(stored, folder / "model.safetensors", metadata={"format": "pt"})
    model.config.save_pretrained(folder)
    if model.generation_config is not None:
        model.generation_config.save_pretrained(folder)
    AutoTokenizer.from_pretrained(base_dir).save_pretrained(folder)


def read_metrics(folder: Path) -> dict[str, float]:
    """The metrics saved with the checkpoint in `folder` (step, loss, learning_rate, tokens_per_s)."""
    metrics: dict[str, float] = json.loads((folder / METRICS_FILE).read_text(encoding="utf-8"))
    return metrics


def load_adapter(folder: Path, model: Any) -> dict[str, Any]:
    """Load the checkpoint's adapter into the (not yet wrapped or sharded) PEFT model; return its trainer state."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    state = read_trainer_state(folder)
    set_peft_model_state_dict(model, load_file(folder / ADAPTER_FOLDER / "adapter_model.safetensors"))
    return state


def read_trainer_state(folder: Path, finetune: str = "lora") -> dict[str, Any]:
    """The checkpoint's optimizer state, scheduler, RNG streams, step and strategy.

    A full fine-tune's weights come with its model, loaded from the checkpoint's model folder; a checkpoint holding
    the other `finetune`'s weights is refused.
    """
    import torch

    state: dict[str, Any] = torch.load(folder / STATE_FILE, weights_only=False)
    if "strategy" not in state:
        raise StepInputError(
            f"{folder} was written by an older eksflow (optimizer state keyed by position, not by parameter name) "
            f"and cannot be resumed: start a new run (another run_name) or delete {folder.parent}"
        )
    if not trained_folder(folder, finetune).is_dir():
        raise StepInputError(
            f"{folder} holds no {trained_folder(folder, finetune).name} folder: it was written with another "
            f"train.finetune than {finetune}; start a new run (another run_name) or delete {folder.parent}"
        )
    return state


def restore_state(state: dict[str, Any], model: Any, optimizer: Any, scheduler: Any, rank: int) -> None:
    """Optimizer (full state by parameter name, sharded here when the model is), scheduler and RNG streams."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(model, optimizer, state["optimizer"], options=StateDictOptions(full_state_dict=True))
    restore_progress(state, scheduler, rank)


def device_rng(saved: Any, device: int) -> Any:
    """The saved CUDA random state for GPU `device`; None when there is none.

    A checkpoint holds one state (its training device's); an older one, a list of every visible GPU's: that GPU's
    entry, if it has one.
    """
    if isinstance(saved, (list, tuple)):
        return saved[device] if device < len(saved) else None
    return saved


def restore_progress(state: dict[str, Any], scheduler: Any, rank: int) -> None:
    """Scheduler and RNG streams: what every strategy restores the same way after its optimizer state."""
    import torch

    scheduler.load_state_dict(state["scheduler"])
    torch.set_rng_state(state["torch_rng"])
    random.setstate(state["python_rng"])
    if (
        torch.cuda.is_available()
        and (cuda_rng := device_rng(state["cuda_rng"], torch.cuda.current_device())) is not None
    ):
        torch.cuda.set_rng_state(cuda_rng)
    if rank:
        torch.manual_seed(int(state["step"]) * 7919 + rank)  # distinct dropout streams per rank
