"""Checkpoint contents: the full (unsharded) adapter and optimizer state by parameter name, scheduler, RNG, step."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from eksflow.runtime.args import StepInputError

STATE_FILE = "trainer_state.pt"
METRICS_FILE = "metrics.json"  # the last logging window's metrics, saved with each checkpoint


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
    adapter: dict[str, Any],
    optimizer_state: dict[str, Any],
    scheduler: Any,
    strategy: str,
    metrics: dict[str, float],
) -> None:
    """Write one checkpoint's files into `folder` (rank 0 only; checkpoints.commit makes it visible)."""
    import torch

    if rank != 0:  # per-rank files would collide (docs/reliability.md): rank 0 holds the gathered full state
        raise RuntimeError(f"rank {rank} tried to write checkpoint {folder}; only rank 0 writes checkpoints")
    (folder / METRICS_FILE).write_text(json.dumps(metrics), encoding="utf-8")
    # PEFT picks the adapter's tensors out of the full state and names them as evaluate and register expect.
    _unwrap(model).save_pretrained(folder / "adapter", safe_serialization=True, state_dict=adapter)
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


def read_metrics(folder: Path) -> dict[str, float]:
    """The metrics saved with the checkpoint in `folder` (step, loss, learning_rate, tokens_per_s)."""
    metrics: dict[str, float] = json.loads((folder / METRICS_FILE).read_text(encoding="utf-8"))
    return metrics


def load_adapter(folder: Path, model: Any) -> dict[str, Any]:
    """Load the checkpoint's adapter into the (not yet wrapped or sharded) PEFT model; return its trainer state."""
    import torch
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    state: dict[str, Any] = torch.load(folder / STATE_FILE, weights_only=False)
    if "strategy" not in state:
        raise StepInputError(
            f"{folder} was written by an older eksflow (optimizer state keyed by position, not by parameter name) "
            f"and cannot be resumed: start a new run (another run_name) or delete {folder.parent}"
        )
    set_peft_model_state_dict(model, load_file(folder / "adapter" / "adapter_model.safetensors"))
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
