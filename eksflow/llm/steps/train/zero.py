"""DeepSpeed ZeRO (stage 1, 2 or 3, optional CPU offload) inside the shared training loop.

The engine gets the loop's own torch AdamW and keeps the loop's LR schedule (a LambdaLR over the same parameter
groups, stepped by the loop), so a ZeRO step applies DDP's update: same clipping (DeepSpeed's `gradient_clipping`
is clip_grad_norm_ over the whole gradient), same AdamW, same learning rate. Measured on 2 CPU workers: ZeRO-1, 2
and 3 per-step losses within 5e-7 of DDP's (tests/e2e/test_train_zero.py).

Checkpoints keep the one format every strategy writes (eksflow.llm.steps.train.state): `full_state` gathers the
adapter's fp32 weights and AdamW moments from their ZeRO partitions with DeepSpeed's own tensor-fragment API
(deepspeed.utils.safe_get_full_*: an all-reduce for stages 1-2, an all-gather for stage 3), keyed by parameter
name like DDP's and FSDP's; `restore` scatters such a state back into the partitions. So DDP, FSDP and ZeRO runs
resume each other's checkpoints.

DeepSpeed is imported here only, inside functions: the pipeline imports eksflow.llm.steps.train and must stay light.
"""

from __future__ import annotations

import ctypes
import logging
import os
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

from eksflow.llm.steps.common import strategies
from eksflow.llm.steps.train import TrainSettings
from eksflow.llm.steps.train.state import restore_progress
from eksflow.runtime.args import StepInputError

MOMENTS = ("exp_avg", "exp_avg_sq")  # torch AdamW's per-parameter state besides `step`
# Ops DeepSpeed would JIT-compile (g++, ninja, ~/.cache/torch_extensions) that training never calls.
# deepspeed_shm_comm: TorchBackend builds it whenever the CPU accelerator starts, but it only serves
# `inference_all_reduce` (AutoTP inference); ZeRO's collectives go through the process group (gloo).
UNUSED_OPS = ("deepspeed_shm_comm",)


@dataclass
class ZeroUpdate:
    """The loop's optimizer step on a DeepSpeed engine: the same calls as parallel.TorchUpdate."""

    model: Any  # the DeepSpeedEngine (its `module` is the PEFT model)
    zero_optimizer: Any  # DeepSpeed's ZeRO optimizer around the loop's AdamW
    scheduler: Any  # the loop's LambdaLR over the AdamW's parameter groups

    def sync(self, last: bool) -> AbstractContextManager[None]:
        """No context: the engine reduces gradients at its own accumulation boundary."""
        return nullcontext()

    def backward(self, loss: Any, last: bool) -> None:
        """Backward through the engine (ZeRO's gradient hooks); `loss` is already divided by grad_accum_steps."""
        self.model.backward(loss, scale_wrt_gas=False)
        if not last:
            self.model.step()  # a micro-step: DeepSpeed counts them to find its accumulation boundary

    def step(self) -> None:
        """Clip, AdamW step and zero the gradients (the engine at its boundary), then the loop's LR schedule."""
        self.model.step()
        self.scheduler.step()

    def full_state(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The adapter and its optimizer state, whole and keyed by name, as state.full_state; empty off rank 0.

        A collective: every rank calls it at the same step.
        """
        import torch.distributed as dist
        from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

        rank0 = dist.get_rank() == 0
        adapter: dict[str, Any] = {}
        moments: dict[str, dict[str, Any]] = {}
        step = self._step()
        for name, param in _trainable(self.model):
            weight = safe_get_full_fp32_param(param)
            gathered = {key: safe_get_full_optimizer_state(param, key) for key in MOMENTS}
            if rank0:
                adapter[name] = weight.detach().cpu().clone()
                moments[name] = {"step": step.clone(), **{k: v.detach().cpu().clone() for k, v in gathered.items()}}
        if not rank0:
            return {}, {}
        hyper = {k: v for k, v in self._base().param_groups[0].items() if k != "params"}
        return adapter, {"state": moments, "param_groups": [{**hyper, "params": list(adapter)}]}

    def restore(self, state: dict[str, Any], rank: int) -> None:
        """Load a full-state checkpoint (any strategy's) into the partitions, then the scheduler and RNG streams.

        The adapter's weights are already in the model (loaded before the engine copied them into its fp32
        partitions); this sets the AdamW moments, step and hyper-parameters.
        """
        import torch
        from deepspeed.utils import safe_set_full_optimizer_state

        saved = state["optimizer"]
        names = [name for name, _ in _trainable(self.model)]
        missing = sorted(set(names) - set(saved["state"]))
        if missing:
            raise StepInputError(
                f"the checkpoint has no optimizer state for {len(missing)} adapter parameter(s) such as {missing[0]}: "
                "it was written for another adapter shape (lora.rank or lora.target_modules); start a new run"
            )
        steps = {float(saved["state"][name]["step"]) for name in names}
        if len(steps) != 1:
            raise StepInputError(f"the checkpoint's parameters were stepped {sorted(steps)} times; ZeRO has one count")
        (count,) = steps
        base = self._base()
        hyper = {k: v for k, v in saved["param_groups"][0].items() if k != "params"}
        for group in base.param_groups:
            group.update(hyper)  # lr, initial_lr, betas...: the next step's, as the saving run left them
        for flat in self._flats():  # AdamW creates its state lazily at the first step: create it now
            base.state[flat] = {
                "step": torch.tensor(count, dtype=torch.float32),
                **{key: torch.zeros_like(flat) for key in MOMENTS},
            }
        if hasattr(self.zero_optimizer, "_lazy_init_hp_params_optimizer_state"):
            # ZeRO-1/2 link each parameter's fragment to the optimizer state after the first step; link them now.
            self.zero_optimizer._lazy_init_hp_params_optimizer_state()
        for name, param in _trainable(self.model):
            for key in MOMENTS:
                value = saved["state"][name][key].to(device=self.model.device, dtype=torch.float32)
                safe_set_full_optimizer_state(param, value, key)
        restore_progress(state, self.scheduler, rank)

    def _base(self) -> Any:
        """The torch AdamW inside the ZeRO optimizer, now holding the flat fp32 partitions."""
        return self.zero_optimizer.optimizer

    def _flats(self) -> list[Any]:
        """The flat fp32 partitions AdamW steps (ZeRO-3 puts each in its parameter group only while stepping it)."""
        for attribute in ("fp32_partitioned_groups_flat", "single_partition_of_fp32_groups"):  # stage 3, stage 1-2
            if hasattr(self.zero_optimizer, attribute):
                return list(getattr(self.zero_optimizer, attribute))
        raise TypeError(f"{type(self.zero_optimizer).__name__} is not a ZeRO optimizer this step knows")

    def _step(self) -> Any:
        """AdamW's step count (one per flat partition, the same for all)."""
        import torch

        state = self._base().state
        counts = {float(state[flat]["step"]) for flat in self._flats() if "step" in state.get(flat, {})}
        if len(counts) != 1:
            raise RuntimeError(f"ZeRO partitions were stepped {sorted(counts)} times; a checkpoint needs one count")
        return torch.tensor(counts.pop(), dtype=torch.float32)


def _return_freed_buffers() -> None:
    """Make glibc give freed large buffers back to the OS at once (ZeRO-3 on CPU; glibc only, else nothing).

    ZeRO-3 gathers each layer's parameters into fresh host buffers and frees them after use. glibc's mmap threshold
    rises to the size of the first large buffer freed (up to 32 MiB), after which such buffers come from the heap
    and stay resident when freed: the worker holds as much as a gathered model. A fixed 128 KiB threshold keeps
    them mmap-ed (measured on SmolLM2-135M, 2 workers: 1.51 GiB resident per worker after two steps, 0.99 with it).
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    m_mmap_threshold = -3  # mallopt's M_MMAP_THRESHOLD (malloc.h); setting it also stops the dynamic adjustment
    libc.mallopt(m_mmap_threshold, 128 * 1024)


def _largest_layer(model: Any) -> int:
    """Parameters of the model's largest decoder layer (ZeRO-3 keeps about two gathered); 0 if it names none."""
    try:
        units = strategies.fsdp_units(model)
    except StepInputError:
        return 0  # DeepSpeed's defaults: every gathered parameter stays until its backward
    return int(max(sum(p.numel() for p in unit.parameters()) for unit in units))


def _trainable(engine: Any) -> list[tuple[str, Any]]:
    """The adapter's parameters by the names DDP's and FSDP's state dicts use (the PEFT model's)."""
    return [(name, p) for name, p in engine.module.named_parameters() if p.requires_grad]


def engine_update(
    model: Any,
    optimizer: Any,
    scheduler: Any,
    plan: strategies.Plan,
    settings: TrainSettings,
    device: Any,
    bf16: bool,
) -> ZeroUpdate:
    """Wrap `model` and the loop's AdamW in a DeepSpeed engine for `plan` (ZeRO stage, offload) on `device`.

    bf16 on GPU only (parallel.resolve_precision); fp32 otherwise.

    Needs the default process group (Ray Train's, mpirun's, or the local launcher's 1-rank group): DeepSpeed
    adopts it instead of starting its own rendezvous.
    """
    on_gpu = device.type == "cuda"
    os.environ.setdefault("DS_ACCELERATOR", "cuda" if on_gpu else "cpu")  # read once, at DeepSpeed's first use
    # DeepSpeed asserts that a launcher set LOCAL_RANK (and picks the GPU by it): Ray Train and
    # eksflow.llm.steps.train.mpi do; the local launcher's one process is rank 0.
    os.environ.setdefault("LOCAL_RANK", str(device.index or 0))
    import deepspeed

    for op in UNUSED_OPS:  # DeepSpeed's documented switch: the probed table of compatible ops, kept per process
        deepspeed.ops.__compatible_ops__[op] = False
    deepspeed.utils.logger.setLevel(logging.WARNING)  # its INFO lines repeat the whole config on every rank
    deepspeed.init_distributed(dist_backend="nccl" if on_gpu else "gloo", auto_mpi_discovery=False, verbose=False)
    if plan.zero_stage == 3 and not on_gpu:
        _return_freed_buffers()
    config = strategies.deepspeed_config(
        plan,
        micro_batch_size=settings.micro_batch_size,
        grad_accum_steps=settings.grad_accum_steps,
        max_grad_norm=settings.max_grad_norm,
        bf16=bf16,
        layer_params=_largest_layer(model),
    )
    engine, zero_optimizer, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    return ZeroUpdate(engine, zero_optimizer, scheduler)
