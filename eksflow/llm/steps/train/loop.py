"""The training loop every worker runs (a Ray Train worker, or this process with `--launcher=local`).

Data order is a pure function of (seed, step) and checkpoints hold the full state, so a resume continues exactly.
"""

from __future__ import annotations

import math
import os
import socket
import threading
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from eksflow.llm.steps.common import checkpoints, strategies, tracking
from eksflow.llm.steps.train import TrainSettings
from eksflow.llm.steps.train.commits import Commits
from eksflow.llm.steps.train.data import MicroBatches, open_cache
from eksflow.llm.steps.train.parallel import (
    TorchUpdate,
    Update,
    collective_device,
    plan_strategy,
    process_group,
    resolve_precision,
    shard,
)
from eksflow.llm.steps.train.state import MODEL_FOLDER, load_adapter, read_trainer_state
from eksflow.runtime import trainer_status
from eksflow.runtime.outputs import Progress

STOP_FILE = "STOP"  # in the checkpoint root: the driver asks the workers to checkpoint and stop (SIGTERM)


class LoopConfig(BaseModel):
    """What each Ray Train worker needs; plain data so Ray can ship it."""

    settings: TrainSettings
    model_dir: str
    train_file: str
    checkpoint_root: str
    tracking_uri: str
    mlflow_run_id: str
    progress_file: str
    checkpoint_uri: str = ""
    token_cache: str = ""  # the verified cache folder (eksflow.llm.steps.common.token_cache); "": the worker builds one
    pad_token_id: int = 0  # the tokenizer's, so that workers need no tokenizer


@dataclass(frozen=True)
class WorkerContext:
    """Where one training worker runs: filled by the Ray Train wrapper, or by `local_context` for one process."""

    rank: int
    world: int
    device: Any  # torch.device
    prepare_model: Callable[[Any], Any]  # the DDP path: wraps the model in DDP and moves it to `device`
    # True once this process got SIGTERM (local launcher); Ray workers see the driver's request as STOP_FILE
    # (a Ray worker is another process: the driver's Event never reaches it).
    stop_requested: Callable[[], bool] = lambda: False
    # The preemption notices Ray Train gave this worker (drains of a node of its group), and the earliest deadline
    # among them (UNIX seconds; 0: none)
    preempted: Callable[[], tuple[int, float]] = lambda: (0, 0.0)


sigterm_received = threading.Event()  # set by the driver's SIGTERM handler (eksflow.llm.steps.train.step)


def local_context(settings: TrainSettings) -> WorkerContext:
    """World size 1 in this process: the same loop as a Ray worker, without Ray."""
    import torch

    device = torch.device("cuda:0" if settings.use_gpu and torch.cuda.is_available() else "cpu")
    return WorkerContext(
        rank=0,
        world=1,
        device=device,
        prepare_model=lambda model: model.to(device),
        stop_requested=sigterm_received.is_set,
    )


def lr_factor(step: int, settings: TrainSettings) -> float:
    """Linear warm-up to 1, then cosine decay to `min_lr_ratio` at `max_steps`."""
    if step < settings.warmup_steps:
        return (step + 1) / settings.warmup_steps
    span = max(settings.max_steps - settings.warmup_steps, 1)
    progress = min((step - settings.warmup_steps) / span, 1.0)
    cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
    return settings.min_lr_ratio + (1.0 - settings.min_lr_ratio) * cosine


def train_loop(config: dict[str, Any]) -> None:
    """One Ray Train worker: fill the WorkerContext from Ray Train and run the shared loop.

    It never calls ray.train.report: a worker's report waits for Ray Train's controller to take the previous one
    (a queue of one, polled every 2 s), which held every checkpoint up to 2 s (a 16-step run committing each step
    took 62 s instead of 29). The metrics go to MLflow and into each checkpoint, where the step's outputs read them.
    """
    import ray.train
    import ray.train.torch

    loop = LoopConfig.model_validate(config)
    context = ray.train.get_context()
    train_worker(
        loop,
        WorkerContext(
            rank=context.get_world_rank(),
            world=context.get_world_size(),
            device=ray.train.torch.get_device(),
            prepare_model=ray.train.torch.prepare_model,  # DDP; broadcasts rank 0's weights
            preempted=PreemptionNotices(),
        ),
    )


class PreemptionNotices:
    """The preemption notices Ray Train gave this worker (each new mark counts once) and their earliest deadline.

    Ray Train's PreemptionWatcher marks every worker when Ray drains one of their nodes. A Spot node's worker pod is
    drained twice: by its preStop hook on the notice (eksflow/launchers/rayjob.py), then by `ray start` on the
    terminating signal, with a deadline 30 s on (RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S), when it kills the node's
    processes; each drain is a new mark with its own deadline. This reads the worker's own mark, which
    `ray.train.get_preemption_info` would broadcast from rank 0 in a collective of its own each step; the loop's
    per-step agreement (parallel.agree) already is one.
    """

    def __init__(self) -> None:
        self.last: object = None  # the mark counted last (a PreemptionInfo: compared by value)
        self.count = 0
        self.deadline_s = 0.0  # the earliest deadline of the marks seen (UNIX seconds; 0: none)

    def __call__(self) -> tuple[int, float]:
        """The marks seen so far, this one included, and their earliest deadline."""
        from ray.train.v2._internal.execution.context import get_train_context

        mark = get_train_context().preemption_context.preemption_info
        if mark is not None and mark != self.last:
            self.last, self.count = mark, self.count + 1
            if mark.deadline_ms:
                deadline_s = mark.deadline_ms / 1000
                self.deadline_s = min(self.deadline_s, deadline_s) if self.deadline_s else deadline_s
        return self.count, self.deadline_s


def host_address() -> str:
    """This process's host name and the address it resolves to (a pod's own, from its /etc/hosts)."""
    name = socket.gethostname()
    try:
        return f"{name} {socket.gethostbyname(name)}"
    except OSError:
        return f"{name} (no address)"


def train_worker(loop: LoopConfig, ctx: WorkerContext) -> None:
    """Load, replicate (DDP) or shard (FSDP, ZeRO), (resume,) train, checkpoint. Rank 0 alone writes checkpoints.

    Stops early, after committing a checkpoint, when a stop is requested (SIGTERM in this process, or STOP_FILE
    written by the driver); every rank agrees on the stopping step through an all-reduce.
    """
    import torch

    from eksflow.llm.steps.train.model import parameter_count, trained_model

    settings = loop.settings
    rank, world, device = ctx.rank, ctx.world, ctx.device
    torch.set_num_threads(settings.cpus_per_worker * (settings.num_workers if world == 1 else 1))
    if world > 1:
        print(f"rank {rank}/{world}: host {host_address()}", flush=True)
    # One seed for the adapter's initialisation on every rank: DDP would broadcast rank 0's weights anyway, but
    # FSDP keeps each rank's own shard of what it initialised.
    torch.manual_seed(settings.seed)

    # A 4-bit base computes in the precision DDP resolves to (QLoRA trains under DDP only: TrainSettings)
    quantized_precision = resolve_precision(settings, device, "ddp") if settings.lora.quantize == "4bit" else "fp32"
    full = settings.finetune == "full"
    root = Path(loop.checkpoint_root)
    start = checkpoints.latest(root)
    # A full fine-tune resumes from the model its checkpoint holds (read_trainer_state refuses a checkpoint without
    # one); LoRA loads the base, then the adapter into it (below).
    state = read_trainer_state(start.path, "full") if full and start else {}
    weights_dir = str(start.path / MODEL_FOLDER) if full and start else loop.model_dir
    model = trained_model(settings, weights_dir, device, quantized_precision)
    if device.type == "cpu":
        from eksflow.llm.steps.train.dropout import use_mask_dropout

        use_mask_dropout(model)
    torch.manual_seed(settings.seed + rank)  # distinct dropout streams per rank
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    plan = plan_strategy(settings, device, world, parameter_count(model), trainable)
    precision = resolve_precision(settings, device, plan.strategy)
    bf16 = precision == "bf16"
    kernels = ""
    if device.type == "cpu" and not bf16 and plan.strategy != "deepspeed":
        # DeepSpeed swaps torch's linear for one that gathers ZeRO-3's partitioned weights: ZeRO keeps it
        from eksflow.llm.steps.train.linear import use_onednn_linears

        kernels = " (the frozen projections through oneDNN)" if use_onednn_linears(model) else ""
    if rank == 0:
        print(f"strategy: {plan.strategy} ({plan.reason}); precision: {precision}{kernels}", flush=True)

    # The adapter goes into the unsharded model (PEFT's own loader); the optimizer state, keyed by parameter name,
    # is loaded once the optimizer exists over the final (possibly sharded) parameters.
    if start and not full:
        state = load_adapter(start.path, model)
    with process_group(device, world) if plan.strategy != "ddp" else nullcontext():
        if plan.strategy != "deepspeed":  # DeepSpeed's engine places and partitions the model itself
            model = shard(model, device, world, bf16) if plan.strategy == "fsdp" else ctx.prepare_model(model)
        params = [p for p in model.parameters() if p.requires_grad]
        # foreach: the multi-tensor AdamW that torch already picks on CUDA, bitwise the same update as the
        # per-tensor loop it defaults to on CPU, which dispatches a dozen small ops for each of ~240 LoRA tensors.
        # A full fine-tune on CPU keeps the per-tensor loop: over whole weights foreach's temporaries span every
        # parameter at once (SmolLM2-135M: 0.47 s a step against 0.38, twice the page faults; bench/README.md).
        foreach = device.type != "cpu" or not full
        optimizer = torch.optim.AdamW(
            params, lr=settings.learning_rate, weight_decay=settings.weight_decay, foreach=foreach
        )
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, settings))
        update: Update = TorchUpdate(model, optimizer, scheduler, params, settings.max_grad_norm)
        if plan.strategy == "deepspeed":
            from eksflow.llm.steps.train.zero import engine_update

            update = engine_update(model, optimizer, scheduler, plan, settings, device, bf16)
        if start:
            update.restore(state, rank)
            print(
                f"rank {rank}: resumed from {start.path.name} (step {start.step}), saved under "
                f"{state['strategy']}, training under {plan.strategy}",
                flush=True,
            )
        _train(loop, ctx, plan, update, start.step if start else 0, bf16)


def _train(
    loop: LoopConfig,
    ctx: WorkerContext,
    plan: strategies.Plan,
    update: Update,
    first_step: int,
    bf16: bool,
) -> None:
    """Steps `first_step`..max_steps with logging, progress, stop requests and checkpoint commits (rank 0 writes)."""
    import torch

    from eksflow.llm.steps.train.loss import SupervisedObjective
    from eksflow.llm.steps.train.model import reference_model
    from eksflow.llm.steps.train.preference import PreferenceObjective

    settings = loop.settings
    rank, world, device = ctx.rank, ctx.world, ctx.device
    model, scheduler = update.model, update.scheduler
    dpo, full = settings.method == "dpo", settings.finetune == "full"
    # A full fine-tune's DPO reference is a frozen copy of the base, built once; LoRA's is its base, adapter disabled
    reference = reference_model(loop.model_dir, device, bf16) if dpo and full else None
    objective = PreferenceObjective(model, settings.dpo, reference) if dpo else SupervisedObjective(model)
    root = Path(loop.checkpoint_root)
    cache, pad_token_id = open_cache(loop.token_cache, Path(loop.train_file), Path(loop.model_dir), dpo)
    batches = MicroBatches(cache, settings, loop.pad_token_id if pad_token_id is None else pad_token_id)
    if rank == 0 and loop.progress_file:
        os.environ["ARGO_PROGRESS_FILE"] = loop.progress_file
    progress = Progress(settings.max_steps, "train", min_interval_s=0.0 if world == 1 else 2.0) if rank == 0 else None
    status = trainer_status.reporter(settings.max_steps) if rank == 0 else None  # None outside a TrainJob
    if progress:
        progress.advance(first_step)
    if status:
        status.update(first_step, {})
    # FSDP and ZeRO cast through their own mixed-precision settings instead (shard, zero.engine_update).
    bf16_autocast = bf16 and plan.strategy == "ddp"
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if bf16_autocast else nullcontext()
    window_loss, window_steps, tokens, started = 0.0, 0, 0, time.perf_counter()
    window_stats: dict[str, float] = {}  # an objective's own metrics (DPO's rewards), summed over the window's steps
    metrics: dict[str, float] = {}
    commits = Commits(
        root,
        settings,
        rank,
        update,
        plan.strategy,
        stop_requested=ctx.stop_requested,
        stop_file=root / STOP_FILE,
        preempted=ctx.preempted,
        durable_uri=loop.checkpoint_uri,
        base_dir=loop.model_dir if full else "",
    )
    model.train()  # once: nothing in the loop switches to eval (a checkpoint only reads the weights)
    with commits, status or nullcontext():  # the status's last state is sent on leaving, however the loop ends
        for step in range(first_step, settings.max_steps):
            step_loss = 0.0
            for micro in range(settings.grad_accum_steps):
                batch = batches.get(step, micro, rank, world, device)
                tokens += batch.tokens
                last = micro == settings.grad_accum_steps - 1
                with update.sync(last), autocast:
                    loss, stats = objective(batch)
                    loss = loss / settings.grad_accum_steps
                    update.backward(loss, last)
                step_loss += float(loss.detach())
                for name, value in stats.items():  # each micro-batch's mean, averaged over the step's
                    window_stats[name] = window_stats.get(name, 0.0) + value / settings.grad_accum_steps
            update.step()
            window_loss, window_steps = window_loss + step_loss, window_steps + 1
            done = step + 1
            if done % settings.log_every == 0 or done == settings.max_steps:
                means = {name: total / window_steps for name, total in window_stats.items()}
                metrics = _window_metrics(window_loss / window_steps, tokens, started, world, scheduler, means)
                window_loss, window_steps, window_stats = 0.0, 0, {}
                if rank == 0 and loop.mlflow_run_id:
                    tracking.log_metrics(loop.tracking_uri, loop.mlflow_run_id, metrics, step=done)
            if progress:
                note = f"loss {step_loss:.6f}"  # this step's loss on rank 0: the kill/resume tests compare it
                progress.advance(note=note)
            if status:
                status.update(done, metrics)
            if commits.after_step(done, metrics):  # a collective: checkpoint (every rank), stop (every rank)
                return


def _window_metrics(
    local_loss: float,
    local_tokens: int,
    started: float,
    world: int,
    scheduler: Any,
    local_stats: dict[str, float],
) -> dict[str, float]:
    """Loss and the objective's metrics averaged over workers, current LR, and throughput of all workers.

    Throughput counts since this attempt started; every worker's micro-batches hold as many examples, so the mean of
    the workers' means is the mean.
    """
    import torch
    import torch.distributed as dist

    names = sorted(local_stats)
    values = torch.tensor([local_loss, float(local_tokens), *(local_stats[n] for n in names)], dtype=torch.float64)
    if dist.is_available() and dist.is_initialized():
        values = values.to(collective_device())
        dist.all_reduce(values)
    elapsed = max(time.perf_counter() - started, 1e-9)
    return {
        "loss": float(values[0]) / world,
        "learning_rate": float(scheduler.get_last_lr()[0]),
        "tokens_per_s": float(values[1]) / elapsed,
        **{name: float(value) / world for name, value in zip(names, values[2:].tolist(), strict=True)},
    }
