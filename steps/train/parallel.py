"""How the workers share the model: strategy, process group, FSDP2 sharding, and collectives keeping ranks in step."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

from steps.common import strategies
from steps.train import TrainSettings


def plan_strategy(settings: TrainSettings, device: Any, world: int, num_params: int, trainable: int) -> strategies.Plan:
    """Resolve `strategy` for this model and device: DDP or FSDP; DeepSpeed is refused (no loop runs it)."""
    import torch

    memory = torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else 0
    plan = strategies.choose(
        settings.strategy,
        use_gpu=device.type == "cuda",
        num_params=num_params,
        trainable_params=trainable,
        device_memory_bytes=memory,
        world=world,
        zero_stage=settings.zero_stage,
        cpu_offload=settings.cpu_offload,
    )
    return strategies.require_loop_support(plan)


@contextmanager
def process_group(device: Any, world: int) -> Iterator[None]:
    """FSDP needs a process group: Ray Train made one for its workers; the local launcher gets a 1-rank group."""
    import torch.distributed as dist

    if dist.is_initialized():
        yield
        return
    if world != 1:
        raise RuntimeError(f"FSDP over {world} workers needs the process group Ray Train creates; none exists")
    backend = "nccl" if device.type == "cuda" else "gloo"
    store = dist.HashStore()  # type: ignore[attr-defined]  # exported at runtime, absent from torch's type stubs
    dist.init_process_group(backend, store=store, rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def shard(model: Any, device: Any, world: int) -> Any:
    """FSDP2: shard each decoder layer, then the rest (embeddings, norm, head) as the root unit, over all workers."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    if device.type == "cuda":
        torch.cuda.set_device(device)
        precision = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    else:
        precision = MixedPrecisionPolicy()  # fp32 on CPU, as the DDP path
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


def agree(*flags: bool) -> tuple[bool, ...]:
    """The OR of each flag over all workers, so every rank stops or checkpoints at the same step."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return flags
    values = torch.tensor([float(f) for f in flags], device=collective_device())
    dist.all_reduce(values, op=dist.ReduceOp.MAX)
    return tuple(bool(v) for v in values.tolist())


def collective_device() -> Any:
    """Where a tensor must live for the default process group's collectives: NCCL reduces CUDA tensors only."""
    import torch
    import torch.distributed as dist

    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
