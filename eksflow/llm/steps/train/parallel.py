"""How the workers share the model: strategy, process group, FSDP2 sharding, and collectives keeping ranks in step."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, Protocol

from eksflow.llm.steps.common import strategies
from eksflow.llm.steps.train import TrainSettings
from eksflow.llm.steps.train.state import full_state, restore_state
from eksflow.runtime.args import StepInputError


def plan_strategy(settings: TrainSettings, device: Any, world: int, num_params: int, trainable: int) -> strategies.Plan:
    """Resolve `strategy` for this model and device (TrainSettings.resolve_strategy, which `plan` calls too).

    On GPU, `auto` refuses a model that no row of the decision matrix fits, and a full fine-tune one its strategy
    does not fit (as `plan` does before submitting).
    """
    import torch

    on_gpu = device.type == "cuda"
    plan = settings.resolve_strategy(
        num_params=num_params,
        trainable_params=trainable,
        on_gpu=on_gpu,
        device_memory_bytes=torch.cuda.get_device_properties(device).total_memory if on_gpu else 0,
        world=world,
    )
    if settings.finetune == "full" and not plan.fits:
        raise StepInputError(
            f"train.finetune=full: {plan.reason}, about {plan.memory_bytes / strategies.GIB:.1f} GiB per GPU to "
            f"train every one of this model's {num_params:,} parameters, more than this GPU holds; set finetune=lora, "
            "shard it (strategy fsdp or deepspeed with zero_stage 3), or raise num_workers"
        )
    if settings.strategy == "auto" and not plan.fits:
        raise StepInputError(
            f"no strategy fits this model's {num_params:,} parameters: {plan.reason}; raise num_workers, lower "
            "micro_batch_size or max_seq_len, or use larger GPUs"
        )
    return plan


def resolve_precision(settings: TrainSettings, device: Any, strategy: str) -> str:
    """bf16 or fp32: the dtype the frozen model computes in (`precision`; the adapter and AdamW stay fp32).

    `auto` is bf16 on GPU, and on CPU where matrix units compute bf16 natively (AMX: a bf16 matmul of this
    model's shapes runs 3-7x faster than fp32 there; without AMX bf16 is emulated and slower), under DDP only:
    FSDP and ZeRO on CPU train in fp32 (gloo collectives), so a strategy comparison on CPU compares one precision.
    """
    import torch

    if settings.precision != "auto":
        if settings.precision == "bf16" and device.type == "cpu" and strategy != "ddp":
            raise StepInputError(
                f"precision=bf16 on CPU trains under DDP only; strategy auto chose {strategy}: set strategy=ddp "
                "or precision=auto"
            )
        return settings.precision
    if device.type == "cuda":
        return "bf16"
    return "bf16" if strategy == "ddp" and torch.cpu._is_amx_tile_supported() else "fp32"


class Update(Protocol):
    """One optimizer step of the loop, strategy by strategy: TorchUpdate (DDP, FSDP) or zero.ZeroUpdate."""

    model: Any
    scheduler: Any

    def sync(self, last: bool) -> AbstractContextManager[Any]:
        """The context of one micro-batch's forward and backward; `last` ends the accumulation."""

    def backward(self, loss: Any, last: bool) -> None:
        """Backpropagate one micro-batch's loss."""

    def step(self) -> None:
        """Apply the accumulated gradients: clip, optimizer, LR schedule, zero the gradients."""

    def full_state(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """Adapter and optimizer state, whole and keyed by parameter name; empty off rank 0 (a collective)."""

    def restore(self, state: dict[str, Any], rank: int) -> None:
        """Load a checkpoint's optimizer state, scheduler and RNG streams."""


@dataclass
class TorchUpdate:
    """The optimizer step for a DDP-wrapped or FSDP-sharded model and a torch optimizer."""

    model: Any
    optimizer: Any
    scheduler: Any
    params: list[Any]
    max_grad_norm: float

    def sync(self, last: bool) -> AbstractContextManager[Any]:
        """Reduce gradients on the last micro-batch only."""
        return gradient_sync(self.model, last)  # type: ignore[no-any-return]

    def backward(self, loss: Any, last: bool) -> None:
        """Plain autograd; DDP's and FSDP's hooks reduce the gradients."""
        loss.backward()

    def step(self) -> None:
        """Clip the whole gradient, AdamW, the LR schedule, zero the gradients."""
        import torch

        torch.nn.utils.clip_grad_norm_(self.params, self.max_grad_norm)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)

    def full_state(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The torch distributed state dicts, gathered on rank 0."""
        return full_state(self.model, self.optimizer)

    def restore(self, state: dict[str, Any], rank: int) -> None:
        """The torch distributed optimizer state dict (sharded here under FSDP), scheduler, RNG."""
        restore_state(state, self.model, self.optimizer, self.scheduler, rank)


@contextmanager
def process_group(device: Any, world: int) -> Iterator[None]:
    """FSDP and ZeRO need a process group: Ray Train and mpirun made one; the local launcher gets a 1-rank group."""
    import torch.distributed as dist

    if dist.is_initialized():
        yield
        return
    if world != 1:
        raise RuntimeError(f"{world} workers need the process group Ray Train or mpirun creates; none exists")
    backend = "nccl" if device.type == "cuda" else "gloo"
    store = dist.HashStore()  # type: ignore[attr-defined]  # exported at runtime, absent from torch's type stubs
    dist.init_process_group(backend, store=store, rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def shard(model: Any, device: Any, world: int, bf16: bool) -> Any:
    """FSDP2: shard each decoder layer, then the rest (embeddings, norm, head) as the root unit, over all workers.

    bf16 (GPU only: resolve_precision): parameters gathered and computed in bf16, gradients reduced in fp32.
    """
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    if device.type == "cuda":
        torch.cuda.set_device(device)
    precision = (
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else MixedPrecisionPolicy()
    )
    model = model.to(device)
    mesh = init_device_mesh(device.type, (world,))
    for unit in reversed(strategies.fsdp_units(model)):
        fully_shard(unit, mesh=mesh, mp_policy=precision)
    return fully_shard(model, mesh=mesh, mp_policy=precision)


def gradient_sync(model: Any, sync: bool) -> Any:
    """A context for one micro-batch: reduce gradients only on the last one (DDP no_sync; FSDP2's switch)."""
    if hasattr(model, "set_requires_gradient_sync"):  # FSDP2 has no no_sync context
        model.set_requires_gradient_sync(sync)
        return nullcontext()
    return nullcontext() if sync or not hasattr(model, "no_sync") else model.no_sync()


def agree(*values: float) -> tuple[float, ...]:
    """The largest of each value over all workers (a flag's OR), so every rank stops or checkpoints at the same step."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return tuple(float(v) for v in values)
    gathered = torch.tensor([float(v) for v in values], dtype=torch.float64, device=collective_device())
    dist.all_reduce(gathered, op=dist.ReduceOp.MAX)
    return tuple(float(v) for v in gathered.tolist())


def collective_device() -> Any:
    """Where a tensor must live for the default process group's collectives: NCCL reduces CUDA tensors only."""
    import torch
    import torch.distributed as dist

    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
