"""Sizing a training job before it runs: memory per worker, strategy, Spot checkpoints (what `plan` checks).

Pure (no torch): the pipeline's `plan` calls `preflight` through the step's contract module.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from eksflow.runtime.preflight import Layout, Preflight
from steps.train import TrainSettings

GIB = 1024**3
# Rough LoRA memory model (DDP: every worker holds the whole base model; FSDP: 1/world of it): weights x 1.2 for
# the CUDA/Neuron context, adapter optimizer state and buffers, plus activations of about 0.5 MiB per token per
# billion parameters (bf16, ~34 x hidden x layers bytes per token), an eighth of that with gradient checkpointing.
OVERHEAD = 1.2
ACTIVATION_BYTES_PER_TOKEN_PER_B = 0.5 * 1024**2
HEADROOM = 0.9  # refuse plans that need more than 90% of device memory: fragmentation and NCCL buffers need the rest
MODEL_SIZE = re.compile(r"(\d+(?:\.\d+)?)([mb])\b", re.IGNORECASE)


def model_params_b(base_model: str, configured: float) -> float | None:
    """Base model size in billions: configured, or read from a name such as `smollm2-135m` or `llama-3-8b`."""
    if configured:
        return configured
    found = MODEL_SIZE.search(base_model.rsplit("/", 1)[-1])
    if found is None:
        return None
    size = float(found.group(1))
    return size / 1000 if found.group(2).lower() == "m" else size


def memory_per_worker_gib(settings: TrainSettings, layout: Layout, params_b: float, shards: int = 1) -> float:
    """Estimated memory one training process needs on its device (or in RAM on CPU), weights split `shards` ways."""
    bytes_per_param = 4 if layout.kind == "cpu" else 2  # fp32 on CPU, bf16 on GPU and Trainium
    weights = params_b * 1e9 * bytes_per_param * OVERHEAD / shards
    tokens = settings.micro_batch_size * settings.max_seq_len
    activations = tokens * params_b * ACTIVATION_BYTES_PER_TOKEN_PER_B
    if settings.gradient_checkpointing:
        activations /= 8
    return (weights + activations) / GIB


def sharding(settings: TrainSettings, layout: Layout, params_b: float) -> tuple[str, int]:
    """How the train step will hold the weights, and over how many workers they are split.

    Mirrors steps.common.strategies: `auto` shards (FSDP) only on GPUs and only when a replica does not fit one
    device; Trainium splits them by tensor parallelism.
    """
    if layout.kind == "trainium":
        return "NeuronTrainer, tensor parallel", settings.tensor_parallel_size
    if settings.strategy == "fsdp":
        return "fsdp", layout.workers
    replica_fits = memory_per_worker_gib(settings, layout, params_b) <= layout.memory_per_worker_gib * HEADROOM
    if settings.strategy == "auto" and layout.kind == "gpu" and layout.workers > 1 and not replica_fits:
        return "fsdp (auto: a replica does not fit one device)", layout.workers
    return "ddp", 1


def preflight(args: Mapping[str, object], layout: Layout) -> Preflight:
    """Plan rows and problems for a training job with these arguments on this layout."""
    settings = TrainSettings.model_validate({k: v for k, v in args.items() if k in TrainSettings.model_fields})
    base_model = str(args.get("base_model", ""))
    problems = []
    if settings.strategy == "deepspeed":
        problems.append(
            "train.strategy: deepspeed is not run by the training loop (only its config is built and validated); "
            "fix: --set train.strategy=fsdp (parameters sharded over the workers) or auto"
        )
    if layout.spot and settings.checkpoint_every >= settings.max_steps:
        problems.append(
            f"train.checkpoint_every: Spot nodes can be reclaimed, but no checkpoint is written before step "
            f"{settings.max_steps}; fix: --set train.checkpoint_every=<fewer steps> or cluster.spot=false"
        )
    params_b = model_params_b(base_model, layout.model_params_b)
    if params_b is None:
        problems.append(
            f"cluster.model_params_b: cannot tell the size of {base_model!r} from its name; "
            "fix: --set cluster.model_params_b=<billions>"
        )
        return Preflight([], problems)
    strategy, shards = sharding(settings, layout, params_b)
    need = memory_per_worker_gib(settings, layout, params_b, shards)
    available = layout.memory_per_worker_gib
    if need > available * HEADROOM:
        problems.append(
            f"train.micro_batch_size: about {need:.1f} GiB per worker needed ({strategy}), {available:.0f} GiB "
            f"available on {layout.instance_type}; fix: lower train.micro_batch_size or train.max_seq_len, set "
            "train.gradient_checkpointing=true, add cluster.nodes, or pick a larger cluster.instance_type"
        )
    rows = [("strategy", strategy), ("memory per worker", f"~{need:.1f} GiB of {available:.0f} GiB")]
    return Preflight(rows, problems)
