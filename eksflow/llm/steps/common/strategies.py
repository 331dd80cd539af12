"""Which data-parallel strategy trains a model (DDP, FSDP or DeepSpeed ZeRO) and the one memory model behind it.

The memory model (`memory_bytes`) is the only one: the train step feeds it the counted parameters of the loaded
model and `plan` (eksflow/plan.py) feeds it its estimates for the configured model, so both resolve `auto` alike
and print the same per-worker figure. Pure arithmetic, no torch: `plan` imports this module.

Memory of one worker (bytes; LoRA: the base model is frozen, the adapter trains):
    weights      num_params x 2 (bf16, GPU) or 4 (fp32, CPU) x 1.2 (CUDA context, buffers)
    adapter      trainable_params x 16: fp32 weight 4 + gradient 4 + AdamW exp_avg 4 + exp_avg_sq 4
    activations  0.5 MiB per token per billion parameters (bf16, ~34 x hidden x layers bytes per token),
                 an eighth of that with gradient checkpointing
    sharded over the `world` workers by the strategy:
        ddp                 nothing (a full replica per worker)
        fsdp                weights and adapter state
        deepspeed ZeRO-1    optimizer moments;  ZeRO-2: + gradients;  ZeRO-3: + weights and adapter weights
        deepspeed offload   moments live in host memory; ZeRO-3 parameters too, but they are counted on the device
                            (an upper bound: ZeRO-3 gathers each layer's parameters to the device to compute it)
    reference    DPO with a full fine-tune only: a frozen copy of the base's weights (bf16 GPU, fp32 CPU), not sharded
    budget: 90% of the device's memory (fragmentation, NCCL buffers), or of the node's RAM share on CPU
A full fine-tune (train.finetune=full) counts every parameter as trainable (16 bytes: fp32 weight, gradient, two
AdamW moments, sharded as the adapter's are) and as weights only its bf16 compute copy on GPU (none on CPU).

Decision matrix for `auto` (per device, LoRA on frozen bf16 weights):
    fits one device                     -> ddp        (a full replica per worker; the fastest when it fits)
    fits when sharded over the workers  -> fsdp       (parameters sharded, gathered per layer)
    fits sharded with optimizer on CPU  -> deepspeed  ZeRO-3 + CPU offload
    otherwise                           -> refused: more workers or larger devices
On CPU (gloo) workers `auto` is always DDP: a LoRA replica fits host memory and sharding only adds traffic.

What the training loop (eksflow.llm.steps.train) runs, on CPU (gloo; fp32, or bf16 autocast under DDP where the CPU has
AMX: `train.precision`, eksflow.llm.steps.train.parallel.resolve_precision) and GPU (NCCL, bf16):
    ddp        Ray Train's prepare_model (or torch's DDP under mpirun) wraps the model
    fsdp       FSDP2 `fully_shard` on each decoder layer (`fsdp_units`), then on the whole model
    deepspeed  `deepspeed.initialize` with `deepspeed_config`: ZeRO stage 1, 2 or 3, optimizer (and ZeRO-3
               parameter) offload with `cpu_offload`; torch's AdamW and the loop's own LR schedule, so the updates
               are DDP's (eksflow.llm.steps.train.zero)
Every strategy commits the same full-state checkpoint, so a run may resume under another one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from eksflow.runtime.args import StepInputError

Strategy = Literal["auto", "ddp", "fsdp", "deepspeed"]
Layout = Literal["ddp", "fsdp", "deepspeed", "tensor_parallel"]  # how weights are split; Trainium splits by TP
GIB = 1024**3
WEIGHTS_OVERHEAD = 1.2  # CUDA/Neuron context and buffers, on top of the weights
ADAPTER_WEIGHT_BYTES = 4  # fp32
ADAPTER_GRAD_BYTES = 4  # fp32
ADAPTER_MOMENT_BYTES = 8  # AdamW exp_avg + exp_avg_sq, fp32
ACTIVATION_BYTES_PER_TOKEN_PER_B = 0.5 * 1024**2
CHECKPOINTING_DIVISOR = 8  # activations kept with gradient checkpointing: about an eighth
# A parameter a full fine-tune trains: fp32 weight, gradient and AdamW's two moments
FULL_STATE_BYTES = ADAPTER_WEIGHT_BYTES + ADAPTER_GRAD_BYTES + ADAPTER_MOMENT_BYTES
HEADROOM = 0.9  # share of a device's memory a plan may use
ZERO_STAGES = (1, 2, 3)


@dataclass(frozen=True)
class Workload:
    """What one worker trains: the memory model's inputs (counted by the step, estimated by `plan`)."""

    num_params: int  # every parameter of the model, adapter included
    trainable_params: int  # the adapter's
    tokens: int  # per micro-batch per worker: micro_batch_size x max_seq_len
    gradient_checkpointing: bool
    weight_bytes: float  # per frozen parameter: 2 (bf16 on GPU and Trainium), 4 (fp32 on CPU), ~0.56 (NF4, QLoRA)
    reference_bytes: float = 0.0  # DPO with a full fine-tune: the frozen reference's weights, a copy per worker


@dataclass(frozen=True)
class Plan:
    """The resolved strategy, why it was chosen (logged as an MLflow param), and its memory per worker."""

    strategy: Literal["ddp", "fsdp", "deepspeed"]
    zero_stage: int
    cpu_offload: bool
    reason: str
    memory_bytes: int = 0  # the memory model's estimate for one worker
    fits: bool = True  # memory_bytes within the budget (always True where no budget is known)


def memory_bytes(work: Workload, layout: Layout, world: int, zero_stage: int = 2, cpu_offload: bool = False) -> int:
    """Estimated bytes one worker needs on its device under `layout` (see the module docstring's table)."""
    world = max(world, 1)
    weights = work.num_params * work.weight_bytes * WEIGHTS_OVERHEAD
    adapter = float(work.trainable_params * ADAPTER_WEIGHT_BYTES)
    grads = float(work.trainable_params * ADAPTER_GRAD_BYTES)
    moments = float(work.trainable_params * ADAPTER_MOMENT_BYTES)
    if layout in ("fsdp", "tensor_parallel"):
        weights, adapter, grads, moments = weights / world, adapter / world, grads / world, moments / world
    elif layout == "deepspeed":
        moments = 0.0 if cpu_offload else moments / world
        if zero_stage >= 2:
            grads /= world
        if zero_stage == 3:
            weights, adapter = weights / world, adapter / world
    activations = work.tokens * (work.num_params / 1e9) * ACTIVATION_BYTES_PER_TOKEN_PER_B
    if work.gradient_checkpointing:
        activations /= CHECKPOINTING_DIVISOR
    return int(weights + adapter + grads + moments + activations + work.reference_bytes)


def estimate_lora_params(num_params: int, rank: int, target_modules: int) -> int:
    """Adapter size of a Llama-shaped model known only by its size (what `plan` has).

    About 2 x rank x hidden per adapted matrix per layer, with hidden and layers from num_params = 12 x layers x
    hidden^2 and layers = hidden / 128 (Llama 2 and 3; within 0.7-1.2x of the real count from 135M to 70B).
    """
    hidden = (num_params * 128 / 12) ** (1 / 3)
    layers = max(hidden / 128, 1.0)
    return int(layers * target_modules * 2 * hidden * rank)


def choose(
    requested: Strategy,
    *,
    use_gpu: bool,
    work: Workload,
    device_memory_bytes: int,
    world: int,
    zero_stage: int = 2,
    cpu_offload: bool = False,
) -> Plan:
    """Resolve `requested` to a Plan; `auto` follows the decision matrix in the module docstring.

    `device_memory_bytes` is what one worker may use (0: unknown, nothing is refused). A requested strategy is
    returned as asked, with `fits` telling whether the model expects it to fit; `auto` on GPU returns the first row
    of the matrix that fits, or the last one with fits=False.
    """
    if zero_stage not in ZERO_STAGES:
        raise StepInputError(
            f"zero_stage={zero_stage} is not a ZeRO stage; use 1 (shard optimizer state), 2 (+ gradients) or 3 "
            "(+ parameters)"
        )
    budget = int(device_memory_bytes * HEADROOM)

    def planned(strategy: Literal["ddp", "fsdp", "deepspeed"], stage: int, offload: bool, reason: str) -> Plan:
        need = memory_bytes(work, strategy, world, stage, offload)
        return Plan(strategy, stage, offload, reason, need, fits=not budget or need <= budget)

    if requested == "deepspeed":
        return planned("deepspeed", zero_stage, cpu_offload, f"strategy=deepspeed (ZeRO-{zero_stage}) from config")
    if requested != "auto":
        return planned(requested, 0, False, f"strategy={requested} from config")
    if not use_gpu:
        return planned("ddp", 0, False, "CPU workers: a LoRA replica fits host memory; DDP over gloo")
    replica = planned("ddp", 0, False, "")
    if replica.fits:
        return planned("ddp", 0, False, f"a replica needs {_gib(replica.memory_bytes)} of {_gib(budget)} per device")
    sharded = planned("fsdp", 3, False, "")
    if sharded.fits:
        return planned(
            "fsdp",
            3,
            False,
            f"a replica needs {_gib(replica.memory_bytes)}; sharded over {world}: {_gib(sharded.memory_bytes)}",
        )
    offloaded = planned("deepspeed", 3, True, "")
    verdict = "fits" if offloaded.fits else "does not fit"
    return planned(
        "deepspeed",
        3,
        True,
        f"sharded over {world} it needs {_gib(sharded.memory_bytes)}; ZeRO-3 with the optimizer on CPU "
        f"{_gib(offloaded.memory_bytes)} {verdict} {_gib(budget)}",
    )


def _gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


def deepspeed_config(
    plan: Plan,
    *,
    micro_batch_size: int,
    grad_accum_steps: int,
    max_grad_norm: float,
    bf16: bool,
    layer_params: int = 0,
) -> dict[str, Any]:
    """The DeepSpeed config for `plan`; train_batch_size is left to DeepSpeed (micro x accum x world).

    The optimizer is the loop's own torch AdamW (no `optimizer` section): its math is DDP's and FSDP's, so a ZeRO
    run matches them step for step and resumes their checkpoints. With offload that means torch's AdamW on the host
    instead of DeepSpeedCPUAdam, a compiled op (`zero_force_ds_cpu_optimizer: false` allows it).

    ZeRO-3 with `layer_params` (the largest decoder layer's parameter count) keeps about two layers gathered and
    prefetches one: DeepSpeed's defaults (1e9 live parameters and reuse distance) keep every gathered parameter
    of a model under a billion parameters until its backward, so the whole model sits gathered and ZeRO-3 holds
    more than a replica (measured on SmolLM2-135M, 2 CPU workers, micro-batch 2 x 128 tokens, the most resident
    memory per worker during steps: DDP 1.80 GiB, ZeRO-3 1.99 GiB with the defaults, 1.59 GiB with these).
    """
    zero: dict[str, Any] = {"stage": plan.zero_stage, "overlap_comm": bf16, "contiguous_gradients": True}
    if plan.zero_stage == 3 and layer_params:
        zero.update(
            stage3_max_live_parameters=2 * layer_params,
            stage3_max_reuse_distance=2 * layer_params,
            stage3_prefetch_bucket_size=layer_params,
        )
    if plan.cpu_offload:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": bf16}  # pinned host memory speeds GPU copies
        if plan.zero_stage == 3:
            zero["offload_param"] = {"device": "cpu", "pin_memory": bf16}
    return {
        "train_micro_batch_size_per_gpu": micro_batch_size,
        "gradient_accumulation_steps": grad_accum_steps,
        "gradient_clipping": max_grad_norm,
        "bf16": {"enabled": bf16},
        "zero_optimization": zero,
        "zero_force_ds_cpu_optimizer": False,
        "steps_per_print": 10**9,  # eksflow logs loss and throughput itself
    }


def validate_deepspeed_config(config: dict[str, Any]) -> None:
    """Parse `config` with DeepSpeed's own parser; raise StepInputError with its message."""
    try:
        from deepspeed.runtime.config import DeepSpeedConfig
    except ImportError as err:
        raise StepInputError(f"strategy=deepspeed needs deepspeed (pip install 'deepspeed==0.19.8'): {err}") from err
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
