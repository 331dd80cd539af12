"""Sizing a training job before it runs: memory per worker and the strategy, what `plan` checks.

Pure (no torch): the pipeline's `plan` calls `preflight` through the step's contract module. It resolves the
strategy with the same call the train step makes at start-up (TrainSettings.resolve_strategy, the one memory
model in eksflow.llm.steps.common.strategies), fed with estimates: parameters from the model's name, the adapter's size
from its shape. So `plan` and the step agree on DDP, FSDP or ZeRO and on the memory each needs.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from eksflow.llm.steps.common import strategies, vllm_lora
from eksflow.llm.steps.train import ALL_LINEAR, LoraSettings, TrainSettings
from eksflow.runtime.args import StepInputError
from eksflow.runtime.preflight import Layout, Preflight

GIB = 1024**3
MODEL_SIZE = re.compile(r"(\d+(?:\.\d+)?)([mb])\b", re.IGNORECASE)
LLAMA_LINEAR_LAYERS = 7  # q, k, v, o, gate, up, down: what lora.target_modules=all-linear adapts in a Llama layer


def model_params_b(base_model: str, configured: float) -> float | None:
    """Base model size in billions: configured, or read from a name such as `smollm2-135m` or `llama-3-8b`."""
    if configured:
        return configured
    found = MODEL_SIZE.search(base_model.rsplit("/", 1)[-1])
    if found is None:
        return None
    size = float(found.group(1))
    return size / 1000 if found.group(2).lower() == "m" else size


def memory_plan(settings: TrainSettings, layout: Layout, params_b: float) -> tuple[str, strategies.Plan]:
    """How the train step will hold the model and what that takes per worker, as (label, strategy plan)."""
    num_params = int(params_b * 1e9)
    modules = settings.lora.modules_per_layer(LLAMA_LINEAR_LAYERS)
    trainable = (
        num_params
        if settings.finetune == "full"
        else strategies.estimate_lora_params(num_params, settings.lora.rank, modules)
    )
    budget = int(layout.memory_per_worker_gib * GIB)
    if layout.kind == "trainium":
        work = settings.workload(num_params, trainable, weight_bytes=2)
        need = strategies.memory_bytes(work, "tensor_parallel", settings.tensor_parallel_size)
        fits = need <= budget * strategies.HEADROOM
        return "NeuronTrainer, tensor parallel", strategies.Plan("ddp", 0, False, "Trainium", need, fits)
    plan = settings.resolve_strategy(
        num_params=num_params,
        trainable_params=trainable,
        on_gpu=layout.kind == "gpu",
        device_memory_bytes=budget,
        world=layout.workers,
    )
    label: str = plan.strategy
    if plan.strategy == "deepspeed":
        label = f"deepspeed ZeRO-{plan.zero_stage}" + (" with CPU offload" if plan.cpu_offload else "")
    if settings.strategy == "auto" and plan.strategy != "ddp":
        label += " (auto: a replica does not fit one device)"
    return label, plan


def adapter_row(lora: LoraSettings) -> str:
    """What the adapter trains and on what base: `plan`'s row of the LoRA family settings."""
    targets = lora.target_modules
    modules = "all-linear (attention and MLP)" if targets == ALL_LINEAR else ", ".join(targets)
    kind = "DoRA" if lora.use_dora else "LoRA"
    base = "; base in 4-bit NF4 (QLoRA), served unquantized" if lora.quantize == "4bit" else ""
    # register merges such an adapter into its base; the rollout serves it as a whole model (TrainSettings.registers)
    unservable = vllm_lora.unservable_setting(lora.use_dora, lora.target_modules)
    served = (
        "; vLLM cannot serve it as a LoRA: merged into its base at register time and rolled out as a model of its own"
        if unservable
        else ""
    )
    return f"{kind} rank {lora.rank} on {modules}{base}{served}"


def preflight(args: Mapping[str, object], layout: Layout) -> Preflight:
    """Plan rows and problems for a training job with these arguments on this layout."""
    settings = TrainSettings.model_validate({k: v for k, v in args.items() if k in TrainSettings.model_fields})
    base_model = str(args.get("base_model", ""))
    problems = []
    if layout.spot and settings.checkpoint_every >= settings.max_steps:
        problems.append(
            f"train.checkpoint_every: Spot nodes can be reclaimed, but no checkpoint is written before step "
            f"{settings.max_steps}; fix: --set train.checkpoint_every=<fewer steps> or cluster.spot=false"
        )
    if layout.kind == "trainium" and settings.lora.quantize != "none":
        problems.append(
            f"train.lora.quantize: {settings.lora.quantize} needs bitsandbytes, which has no Trainium path; fix: "
            "--set train.lora.quantize=none"
        )
    if layout.kind == "trainium" and settings.finetune == "full":
        problems.append(
            "train.finetune: the Trainium step trains a LoRA adapter (NeuronTrainer), not a full fine-tune; fix: "
            "--set train.finetune=lora, or a CPU or GPU cluster.instance_type"
        )
    params_b = model_params_b(base_model, layout.model_params_b)
    if params_b is None:
        problems.append(
            f"cluster.model_params_b: cannot tell the size of {base_model!r} from its name; "
            "fix: --set cluster.model_params_b=<billions>"
        )
        return Preflight([], problems)
    try:
        label, plan = memory_plan(settings, layout, params_b)
    except StepInputError as err:  # a strategy this layout cannot run (e.g. ZeRO on one worker): the step's words
        return Preflight([], [*problems, f"train.strategy: {err}"])
    full = settings.finetune == "full"
    if not plan.fits and full:
        problems.append(
            f"train.finetune: full needs about {plan.memory_bytes / GIB:.1f} GiB per worker ({label}; 16 bytes a "
            f"parameter to train), {layout.memory_per_worker_gib:.0f} GiB available on {layout.instance_type}; fix: "
            "--set train.finetune=lora, shard it (train.strategy=fsdp or deepspeed with zero_stage=3), add "
            "cluster.nodes, or pick a larger cluster.instance_type"
        )
    elif not plan.fits:
        problems.append(
            f"train.micro_batch_size: about {plan.memory_bytes / GIB:.1f} GiB per worker needed ({label}), "
            f"{layout.memory_per_worker_gib:.0f} GiB available on {layout.instance_type}; fix: lower "
            "train.micro_batch_size or train.max_seq_len, set train.gradient_checkpointing=true, add cluster.nodes, "
            "or pick a larger cluster.instance_type"
        )
    num_params = int(params_b * 1e9)
    rows = [
        ("fine-tune", full_row(settings, num_params, plan)) if full else ("adapter", adapter_row(settings.lora)),
        ("strategy", label),
        ("memory per worker", f"~{plan.memory_bytes / GIB:.1f} GiB of {layout.memory_per_worker_gib:.0f} GiB"),
    ]
    reference = settings.reference_bytes(num_params, layout.kind == "gpu")
    if reference:
        rows.append(("DPO reference", f"a frozen copy of the base on every worker, ~{reference / GIB:.1f} GiB of it"))
    return Preflight(rows, problems)


def full_row(settings: TrainSettings, num_params: int, plan: strategies.Plan) -> str:
    """What a full fine-tune trains and what its training state costs in all, before the strategy shards it."""
    state = num_params * strategies.FULL_STATE_BYTES
    sharded = "" if plan.strategy == "ddp" else f", sharded by {plan.strategy}"
    return (
        f"full: every weight of ~{num_params / 1e9:.2f}B trains; fp32 weights, gradients and AdamW's two moments "
        f"~{state / GIB:.1f} GiB in all{sharded}; the output is a whole model"
    )
