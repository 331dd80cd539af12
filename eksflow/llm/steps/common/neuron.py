"""AWS Trainium: eksflow's `train` config section as optimum-neuron NeuronTrainingArguments keyword arguments.

A pure mapping, so it is tested without the Neuron SDK; optimum-neuron (the `neuron` extra, in the train-neuron
image) is imported only by whoever builds NeuronTrainingArguments from it. Checkpoint cadence and retention map to
the Trainer's save_steps / save_total_limit; bf16 is native on NeuronCores (no loss scaling); zero_1 shards the
optimizer state over the data-parallel ranks.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from eksflow.runtime.args import StepInputError

NEURON_CORES_PER_NODE = 32  # trn1.32xlarge / trn2.48xlarge expose 32 logical NeuronCores
TENSOR_PARALLEL_SIZES = (1, 2, 4, 8, 16, 32)


def training_arguments(train: Mapping[str, Any], output_dir: str) -> dict[str, Any]:
    """NeuronTrainingArguments(**result) for the `train` section `train` (the TrainSettings fields as a dict)."""
    tp = int(train.get("tensor_parallel_size", 1))
    if tp not in TENSOR_PARALLEL_SIZES:
        raise StepInputError(
            f"train.tensor_parallel_size={tp} is not supported on Trainium; use one of {TENSOR_PARALLEL_SIZES}"
        )
    if train.get("strategy", "auto") not in ("auto", "ddp"):
        raise StepInputError(
            f"train.strategy={train['strategy']!r} has no Trainium equivalent; with accelerator=trainium use "
            "strategy=auto (tensor_parallel_size and zero_1 shard the model and optimizer)"
        )
    data_parallel = NEURON_CORES_PER_NODE // tp
    min_lr_ratio = float(train.get("min_lr_ratio", 0.1))
    return {
        "output_dir": output_dir,
        "max_steps": int(train.get("max_steps", 24)),
        "per_device_train_batch_size": int(train.get("micro_batch_size", 8)),
        "gradient_accumulation_steps": int(train.get("grad_accum_steps", 1)),
        "learning_rate": float(train.get("learning_rate", 1e-3)),
        "warmup_steps": int(train.get("warmup_steps", 3)),
        "lr_scheduler_type": "cosine_with_min_lr",
        "lr_scheduler_kwargs": {"min_lr_rate": min_lr_ratio},
        "weight_decay": float(train.get("weight_decay", 0.0)),
        "max_grad_norm": float(train.get("max_grad_norm", 1.0)),
        "bf16": True,
        "tensor_parallel_size": tp,
        "zero_1": data_parallel > 1,  # sharding the optimizer over one data-parallel rank saves nothing
        "gradient_checkpointing": bool(train.get("gradient_checkpointing", False)),
        "save_strategy": "steps",
        "save_steps": int(train.get("checkpoint_every", 8)),
        "save_total_limit": int(train.get("keep_checkpoints", 3)),
        "logging_steps": int(train.get("log_every", 5)),
        "seed": int(train.get("seed", 0)),
        "report_to": [],  # eksflow logs to MLflow itself, through eksflow.llm.steps.common.tracking
    }
