"""Which data-parallel strategy trains a model: DDP, FSDP or DeepSpeed ZeRO, by config or by memory (`auto`).

Decision matrix (per device, LoRA on frozen bf16 weights):
    frozen weights 2 B/param + trainable params, grads and AdamW moments 16 B/param + activations (30% headroom)
    fits one device                     -> ddp        (a full replica per worker; the fastest when it fits)
    fits when sharded over the workers  -> fsdp       (parameters sharded, gathered per layer)
    fits sharded with optimizer on CPU  -> deepspeed  ZeRO-3 + CPU offload
    otherwise                           -> refused: more workers or larger devices
On CPU (gloo) workers `auto` is always DDP: a LoRA replica fits host memory and sharding only adds traffic.

What the training loop (steps.train) runs:
    ddp        CPU (gloo, fp32) and GPU (NCCL, bf16 autocast): Ray Train's prepare_model wraps the model in DDP
    fsdp       CPU (gloo, fp32) and GPU (NCCL, bf16 parameters, fp32 gradient reduction): FSDP2 `fully_shard` on
               each decoder layer (`fsdp_units`), then on the whole model; chosen by `auto` on GPU only, or by
               strategy=fsdp anywhere (tests run it on 2 CPU workers)
    deepspeed  refused with StepInputError: the plan and its ZeRO config (`deepspeed_config`, validated by
               DeepSpeed's own parser) exist, but ZeRO needs GPU workers and the gpu extra, so no loop runs it
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from eksflow.runtime.args import StepInputError

Strategy = Literal["auto", "ddp", "fsdp", "deepspeed"]
FROZEN_BYTES_PER_PARAM = 2  # bf16 weights
TRAINABLE_BYTES_PER_PARAM = 16  # fp32 weight + grad + AdamW exp_avg + exp_avg_sq
ACTIVATION_HEADROOM = 0.7  # the share of device memory that weights and optimizer state may take


@dataclass(frozen=True)
class Plan:
    """The resolved strategy and why it was chosen (logged as an MLflow param)."""

    strategy: Literal["ddp", "fsdp", "deepspeed"]
    zero_stage: int
    cpu_offload: bool
    reason: str


def state_bytes(num_params: int, trainable_params: int) -> int:
    """Bytes of weights and optimizer state for one full replica."""
    return FROZEN_BYTES_PER_PARAM * num_params + TRAINABLE_BYTES_PER_PARAM * trainable_params


def choose(
    requested: Strategy,
    *,
    use_gpu: bool,
    num_params: int,
    trainable_params: int,
    device_memory_bytes: int,
    world: int,
    zero_stage: int = 2,
    cpu_offload: bool = False,
) -> Plan:
    """Resolve `requested` to a Plan; `auto` follows the decision matrix in the module docstring."""
    if zero_stage not in (2, 3):
        raise StepInputError(f"zero_stage={zero_stage} is not supported; use 2 (shard optimizer + grads) or 3")
    if requested == "deepspeed" and not use_gpu:
        raise StepInputError("strategy=deepspeed needs GPU workers (use_gpu=true); on CPU use ddp, fsdp or auto")
    if requested != "auto":
        return Plan(requested, zero_stage, cpu_offload, f"strategy={requested} from config")
    if not use_gpu:
        return Plan("ddp", 0, False, "CPU workers: a LoRA replica fits host memory; DDP over gloo")
    need = state_bytes(num_params, trainable_params)
    budget = int(device_memory_bytes * ACTIVATION_HEADROOM)
    gib = 1024**3
    if need <= budget:
        return Plan("ddp", 0, False, f"replica {need / gib:.1f} GiB fits {budget / gib:.1f} GiB per device")
    if need / world <= budget:
        return Plan("fsdp", 3, False, f"replica {need / gib:.1f} GiB fits only sharded over {world} devices")
    frozen_share = FROZEN_BYTES_PER_PARAM * num_params / world
    if frozen_share <= budget:
        return Plan("deepspeed", 3, True, f"{need / gib:.1f} GiB needs ZeRO-3 with the optimizer on CPU")
    raise StepInputError(
        f"the model's {num_params:,} parameters need {frozen_share / gib:.1f} GiB per device even sharded over "
        f"{world} workers ({budget / gib:.1f} GiB usable): raise num_workers or use larger GPUs"
    )


def require_loop_support(plan: Plan) -> Plan:
    """Return `plan` when the training loop runs it (ddp, fsdp); refuse deepspeed, naming what to use instead."""
    if plan.strategy == "deepspeed":
        raise StepInputError(
            f"strategy resolved to deepspeed ({plan.reason}), which the training loop does not run: DeepSpeed ZeRO "
            "needs GPU workers and the gpu extra, and only its config is built and validated here. Use "
            "strategy=fsdp (parameters sharded over the workers), more workers, or larger GPUs"
        )
    return plan


def deepspeed_config(
    plan: Plan, *, micro_batch_size: int, grad_accum_steps: int, max_grad_norm: float, bf16: bool
) -> dict[str, Any]:
    """The DeepSpeed config for `plan`; train_batch_size is left to DeepSpeed (micro x accum x world)."""
    zero: dict[str, Any] = {"stage": plan.zero_stage, "overlap_comm": True, "contiguous_gradients": True}
    if plan.cpu_offload:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
        if plan.zero_stage == 3:
            zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    return {
        "train_micro_batch_size_per_gpu": micro_batch_size,
        "gradient_accumulation_steps": grad_accum_steps,
        "gradient_clipping": max_grad_norm,
        "bf16": {"enabled": bf16},
        "zero_optimization": zero,
        "steps_per_print": 10**9,  # eksflow logs loss and throughput itself
    }


def validate_deepspeed_config(config: dict[str, Any]) -> None:
    """Parse `config` with DeepSpeed's own parser (the gpu extra); raise StepInputError with its message."""
    try:
        from deepspeed.runtime.config import DeepSpeedConfig
    except ImportError as err:
        raise StepInputError(f"strategy=deepspeed needs the gpu extra (pip install 'eksflow[gpu]'): {err}") from err
    try:
        DeepSpeedConfig(config)
    except Exception as err:  # DeepSpeed raises AssertionError, ValueError or pydantic errors for bad configs
        raise StepInputError(f"invalid DeepSpeed config {config}: {err}") from err


def fsdp_units(model: Any) -> list[Any]:
    """The submodules FSDP shards one by one: the decoder layers, found by the model's `_no_split_modules` names.

    `model` may be a PEFT wrapper; the names come from the transformers model inside it. Returned in module order,
    outer before inner, so shard them in reverse (FSDP requires children before their parents).
    """
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    names = set(getattr(base, "_no_split_modules", None) or ())
    units = [module for module in model.modules() if type(module).__name__ in names]
    if not units:
        raise StepInputError(
            f"strategy=fsdp: {type(base).__name__} names no decoder layer class in _no_split_modules "
            f"({sorted(names) or 'empty'}) matching one of its submodules, so there is nothing to shard per layer; "
            "use strategy=ddp for this model"
        )
    return units
