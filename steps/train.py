"""Fine-tune a LoRA adapter on the staged dataset with Ray Train (TorchTrainer: DDP or FSDP; gloo on CPU, NCCL on GPU).

    python -m steps.train --dataset-dir=/fsx/run/data --base-model=smollm2-135m-instruct --output-dir=/fsx/run/train

Locally Ray starts in-process (`ray.init()`); inside a KubeRay RayJob the same entrypoint joins the cluster through
RAY_ADDRESS. Every `checkpoint_every` steps rank 0 commits a checkpoint under <output_dir>/checkpoints (adapter,
optimizer, scheduler, RNG, step; see steps.common.checkpoints); a rerun with the same output dir resumes from the
newest verified checkpoint, and the data order is a pure function of (seed, step), so it continues exactly.
Checkpoints hold full (unsharded) state keyed by parameter name, whatever the strategy (`strategy`: DDP replicas,
or FSDP2 shards per decoder layer; see steps.common.strategies), so a run may resume under the other strategy.

`--launcher=local` runs the same training loop in this process (world size 1, no Ray; FSDP gets a 1-rank process
group): tests and benchmarks use it to skip Ray's start-up and shutdown (~25 s on 2 CPU cores). A lease
(steps.common.lease) keeps a second trainer off the same checkpoints, and the checkpoint root records the run_name:
a retry resumes, another run is refused. With `--checkpoint-uri=s3://...` each committed checkpoint also gets a
durable copy in the background (marker last), restored when the local root is empty.

Spot: SIGTERM asks every worker to stop after the current step; rank 0 commits a checkpoint and the step exits
with EXIT_PREEMPTED (143, what a SIGTERM-killed process reports), which the workflow's retry expression retries
(it retries everything but 2, bad input); the retry resumes from that checkpoint. One optimizer step plus a LoRA
commit takes seconds, well inside the 2-minute Spot notice and the default 30 s grace period on CPU demo sizes.

Outputs (one file each under --outputs-dir):
    adapter_dir     the final LoRA adapter (peft format), inside the last checkpoint
    checkpoint_dir  the last committed checkpoint
    final_loss      mean training loss over the last logging window
    tokens_per_s    training throughput: non-padding tokens per second, all workers
    mlflow_run_id   the MLflow run with params and metrics ("" when MLflow was unreachable)
"""

from __future__ import annotations

import json
import math
import os
import random
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import FrameType
from typing import Any, Literal

from pydantic import BaseModel, Field

from eksflow.runtime.args import Settings, StepArgs, StepFailedError, StepInputError, run_step
from eksflow.runtime.outputs import Progress
from steps.common import checkpoints, lease, strategies, tracking
from steps.common.base_model import default_cache_dir, resolve_model
from steps.common.data import TRAIN_FILE, load_examples

RUN_ID_FILE = "mlflow_run_id"
STATE_FILE = "trainer_state.pt"
METRICS_FILE = "metrics.json"  # the last logging window's metrics, saved with each checkpoint
STOP_FILE = "STOP"  # in the checkpoint root: the driver asks the workers to checkpoint and stop (SIGTERM)
# Argo owns retries (one budget across Argo x RayJob x Ray Train): a failed worker fails this attempt.
MAX_FAILURES = 0
EXIT_PREEMPTED = 143  # 128 + SIGTERM: retried by the workflow's retry expression (only 2 is not)


class PreemptedError(Exception):
    """SIGTERM arrived; a checkpoint was committed and the step should exit with EXIT_PREEMPTED."""


class LoraSettings(Settings):
    """Low-rank adapter shape (peft LoraConfig)."""

    rank: int = Field(16, ge=1, le=256, description="adapter rank r")
    alpha: int = Field(32, ge=1, description="scaling numerator; usually 2 x rank")
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    target_modules: tuple[str, ...] = Field(("q_proj", "k_proj", "v_proj", "o_proj"), min_length=1)

    def peft_config(self) -> Any:
        """The peft LoraConfig for a causal LM (peft imported here: the pipeline imports this module)."""
        from peft import LoraConfig

        return LoraConfig(
            r=self.rank,
            lora_alpha=self.alpha,
            lora_dropout=self.dropout,
            target_modules=list(self.target_modules),
            task_type="CAUSAL_LM",
        )


class TrainSettings(Settings):
    """Training hyper-parameters and layout (config section `train`)."""

    max_steps: int = Field(24, ge=1, description="optimizer steps")
    micro_batch_size: int = Field(8, ge=1, description="examples per worker per forward pass")
    grad_accum_steps: int = Field(1, ge=1, description="micro-batches per optimizer step")
    learning_rate: float = Field(1e-3, gt=0.0, le=1.0, description="peak learning rate")
    warmup_steps: int = Field(3, ge=0, description="linear warm-up steps before the cosine decay")
    min_lr_ratio: float = Field(0.1, ge=0.0, le=1.0, description="final LR as a fraction of the peak")
    weight_decay: float = Field(0.0, ge=0.0)
    max_grad_norm: float = Field(1.0, gt=0.0)
    max_seq_len: int = Field(256, ge=16, description="tokens per example; longer examples are truncated")
    gradient_checkpointing: bool = Field(False, description="trade compute for activation memory")
    lora: LoraSettings = LoraSettings()
    # Measured on 2 cores: 2 DDP workers x 1 thread run at 0.96-0.975x a bare loop, 1 worker x 2 threads at 0.81x.
    num_workers: int = Field(2, ge=1, description="Ray Train workers (one per GPU on GPU nodes)")
    cpus_per_worker: int = Field(1, ge=1, description="CPU threads per worker")
    use_gpu: bool = Field(False, description="one GPU per worker, NCCL, bf16 compute")
    strategy: strategies.Strategy = Field(
        "auto", description="auto (by memory, see steps.common.strategies), ddp or fsdp; deepspeed is refused"
    )
    zero_stage: int = Field(2, ge=2, le=3, description="DeepSpeed ZeRO stage when strategy resolves to deepspeed")
    cpu_offload: bool = Field(False, description="DeepSpeed: keep optimizer state (and ZeRO-3 params) on CPU")
    tensor_parallel_size: int = Field(1, ge=1, description="Trainium only (steps.common.neuron)")
    checkpoint_every: int = Field(8, ge=1, description="commit a checkpoint every N optimizer steps")
    checkpoint_every_minutes: float = Field(0.0, ge=0.0, description="also commit after this many minutes; 0: off")
    keep_checkpoints: int = Field(3, ge=1, description="keep the newest K committed checkpoints")
    log_every: int = Field(5, ge=1, description="steps between loss/LR/throughput logs")
    seed: int = 0


class Args(TrainSettings, StepArgs):
    """Train step arguments."""

    dataset_dir: Path = Field(description="staged dataset folder holding train.jsonl")
    base_model: str = Field(description="demo name, model folder, or s3:// prefix (steps.common.base_model)")
    model_cache_dir: Path = Field(default_factory=default_cache_dir)
    output_dir: Path = Field(description="run folder on shared storage; checkpoints live under it")
    run_name: str = Field("local", description="the workflow name: a retry resumes, a new run starts fresh")
    checkpoint_uri: str = Field("", description="s3:// prefix for a durable copy of every checkpoint; '' for none")
    launcher: Literal["ray", "local"] = Field("ray", description="ray: Ray Train workers; local: this process")
    tracking_uri: str = ""
    experiment: str = "eksflow"


class Outputs(BaseModel):
    """Train step outputs."""

    adapter_dir: str
    checkpoint_dir: str
    final_loss: float
    tokens_per_s: float
    mlflow_run_id: str


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


@dataclass(frozen=True)
class WorkerContext:
    """Where one training worker runs: filled by the Ray Train wrapper, or by `local_context` for one process."""

    rank: int
    world: int
    device: Any  # torch.device
    prepare_model: Callable[[Any], Any]  # the DDP path: wraps the model in DDP and moves it to `device`
    report: Callable[[dict[str, float]], None]  # tells the launcher about a committed checkpoint
    # True once this process got SIGTERM (local launcher); Ray workers see the driver's request as STOP_FILE.
    # A callable, not the module's Event: Ray pickles train_loop by value when the step runs as __main__.
    stop_requested: Callable[[], bool] = lambda: False


_stop_requested = threading.Event()


def run(args: Args) -> Outputs:
    """Resolve the base model, start (or join) Ray, train, and return the last committed checkpoint."""
    train_file = args.dataset_dir / TRAIN_FILE
    if not train_file.is_file():
        raise StepInputError(f"{train_file} not found; did the stage step finish? (--dataset-dir={args.dataset_dir})")
    if not load_examples(train_file):
        raise StepInputError(f"{train_file} has no examples")
    if args.strategy == "deepspeed":  # refused before Ray starts: bad input exits 2, never a retried job failure
        strategies.require_loop_support(
            strategies.Plan("deepspeed", args.zero_stage, args.cpu_offload, "strategy=deepspeed from config")
        )
    model_dir = resolve_model(args.base_model, args.model_cache_dir)
    args.output_dir.mkdir(parents=True, exist_ok=True)
    root = (args.output_dir / "checkpoints").resolve()
    try:
        lease.claim_run(root, args.run_name)
        held = lease.acquire(root, args.run_name)
    except lease.RunMismatchError as err:
        raise StepInputError(str(err)) from err
    except lease.LeaseHeldError as err:
        raise StepFailedError(str(err)) from err
    try:
        return _run_holding_lease(args, model_dir, root, held)
    finally:
        held.release()


def _run_holding_lease(args: Args, model_dir: Path, root: Path, held: lease.Lease) -> Outputs:
    train_file = args.dataset_dir / TRAIN_FILE
    if args.checkpoint_uri and checkpoints.latest(root) is None:
        restored = checkpoints.restore_latest(args.checkpoint_uri, root)
        if restored:
            print(f"restored {restored.path.name} from the durable copy in {args.checkpoint_uri}")
    (root / STOP_FILE).unlink(missing_ok=True)  # a stop request is for the attempt that received SIGTERM
    run_id = _mlflow_run(args)
    loop = LoopConfig(
        settings=TrainSettings.model_validate(args.model_dump(include=set(TrainSettings.model_fields))),
        # Absolute paths: Ray workers do not share the driver's working directory.
        model_dir=str(model_dir.resolve()),
        train_file=str(train_file.resolve()),
        checkpoint_root=str(root),
        tracking_uri=args.tracking_uri,
        mlflow_run_id=run_id,
        progress_file=os.environ.get("ARGO_PROGRESS_FILE", ""),
        checkpoint_uri=args.checkpoint_uri,
    )
    _stop_requested.clear()
    previous = _on_sigterm(root)
    try:
        with held.kept_alive():
            if args.launcher == "local":
                train_worker(loop, local_context(loop.settings))
            else:
                _fit(loop, args.output_dir / "ray", args.run_name)
    finally:
        signal.signal(signal.SIGTERM, previous)
    final = checkpoints.latest(root)
    if _stop_requested.is_set() and (final is None or final.step < args.max_steps):
        step = final.step if final else 0
        raise PreemptedError(f"SIGTERM: stopped after step {step}/{args.max_steps} with a committed checkpoint")
    if final is None or final.step < args.max_steps:
        raise RuntimeError(f"training ended without a final checkpoint in {loop.checkpoint_root}")
    metrics = json.loads((final.path / METRICS_FILE).read_text(encoding="utf-8"))
    return Outputs(
        adapter_dir=str(final.path / "adapter"),
        checkpoint_dir=str(final.path),
        final_loss=float(metrics.get("loss", math.nan)),
        tokens_per_s=float(metrics.get("tokens_per_s", 0.0)),
        mlflow_run_id=run_id,
    )


def _on_sigterm(root: Path) -> Any:
    """Install the Spot handler: ask the workers (this process, or Ray's through STOP_FILE) to checkpoint and stop."""

    def handler(signum: int, frame: FrameType | None) -> None:
        _stop_requested.set()
        (root / STOP_FILE).write_text(str(os.getpid()), encoding="utf-8")
        print("SIGTERM: committing a checkpoint after the current step, then exiting", file=sys.stderr, flush=True)

    return signal.signal(signal.SIGTERM, handler)


def local_context(settings: TrainSettings) -> WorkerContext:
    """World size 1 in this process: the same loop as a Ray worker, without Ray."""
    import torch

    device = torch.device("cuda:0" if settings.use_gpu and torch.cuda.is_available() else "cpu")
    return WorkerContext(
        rank=0,
        world=1,
        device=device,
        prepare_model=lambda model: model.to(device),
        report=lambda metrics: None,
        stop_requested=_stop_requested.is_set,
    )


def _mlflow_run(args: Args) -> str:
    """The run id stored by an earlier attempt of this step, or a new run; "" when MLflow is unreachable."""
    stored = args.output_dir / RUN_ID_FILE
    if stored.is_file():
        return stored.read_text(encoding="utf-8").strip()
    if not args.tracking_uri:
        return ""
    try:
        run_id = tracking.start_run(args.tracking_uri, args.experiment, args.run_name, {"eksflow.step": "train"})
    except Exception as err:
        print(f"warning: MLflow unreachable, training without tracking: {err}")
        return ""
    tracking.log_params(args.tracking_uri, run_id, _flat_params(args))
    stored.write_text(run_id, encoding="utf-8")
    return run_id


def _flat_params(args: Args) -> dict[str, object]:
    params: dict[str, object] = args.model_dump(include=set(TrainSettings.model_fields), exclude={"lora"})
    params.update({f"lora_{k}": v for k, v in args.lora.model_dump().items()})
    params.update(base_model=args.base_model, dataset_dir=str(args.dataset_dir))
    return params


def _fit(loop: LoopConfig, storage: Path, run_name: str) -> None:
    os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
    os.environ.setdefault("RAY_TRAIN_ENABLE_PRINT_PATCH", "0")  # worker prints once, not twice
    import ray
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    settings = loop.settings
    if not ray.is_initialized():
        address = os.environ.get("RAY_ADDRESS")
        local_cpus = None if address else max(os.cpu_count() or 1, settings.num_workers * settings.cpus_per_worker)
        # 128 MiB object store: training data travels as file paths, not Ray objects.
        # The dashboard process serves Ray's state API, which Ray Train's placement-group cleaner polls every second.
        ray.init(
            address=address,
            num_cpus=local_cpus,
            include_dashboard=None if address else True,
            dashboard_host="127.0.0.1",
            object_store_memory=None if address else 128 * 1024**2,
        )
        _on_sigterm(Path(loop.checkpoint_root))  # ray.init may replace the driver's SIGTERM handler
    trainer = TorchTrainer(
        train_loop,
        train_loop_config=loop.model_dump(mode="json"),
        scaling_config=ScalingConfig(
            num_workers=settings.num_workers,
            use_gpu=settings.use_gpu,
            resources_per_worker={"CPU": settings.cpus_per_worker},
        ),
        # Argo owns retries (one budget, see the workflow's retryStrategy); Ray Train does not retry on its own.
        run_config=RunConfig(
            name=run_name, storage_path=str(storage.resolve()), failure_config=FailureConfig(max_failures=MAX_FAILURES)
        ),
    )
    trainer.fit()


def lr_factor(step: int, settings: TrainSettings) -> float:
    """Linear warm-up to 1, then cosine decay to `min_lr_ratio` at `max_steps`."""
    if step < settings.warmup_steps:
        return (step + 1) / settings.warmup_steps
    span = max(settings.max_steps - settings.warmup_steps, 1)
    progress = min((step - settings.warmup_steps) / span, 1.0)
    cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
    return settings.min_lr_ratio + (1.0 - settings.min_lr_ratio) * cosine


def batch_indices(step: int, micro: int, rank: int, settings: TrainSettings, world: int, n: int) -> list[int]:
    """Example indices for one micro-batch: a pure function of (seed, step), so a resume continues exactly.

    Each epoch is a fresh seeded permutation; global position p maps to permutation(p // n)[p % n].
    """
    global_batch = settings.micro_batch_size * world * settings.grad_accum_steps
    first = step * global_batch + (micro * world + rank) * settings.micro_batch_size
    indices = []
    for position in range(first, first + settings.micro_batch_size):
        order = list(range(n))
        random.Random(settings.seed * 100_003 + position // n).shuffle(order)
        indices.append(order[position % n])
    return indices


def train_loop(config: dict[str, Any]) -> None:
    """One Ray Train worker: fill the WorkerContext from Ray Train and run the shared loop."""
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
            report=ray.train.report,
        ),
    )


def train_worker(loop: LoopConfig, ctx: WorkerContext) -> None:
    """Load, replicate (DDP) or shard (FSDP), (resume,) train, checkpoint. Rank 0 alone writes checkpoints and logs.

    Stops early, after committing a checkpoint, when a stop is requested (SIGTERM in this process, or STOP_FILE
    written by the driver); every rank agrees on the stopping step through an all-reduce.
    """
    import torch
    from peft import get_peft_model

    settings = loop.settings
    rank, world, device = ctx.rank, ctx.world, ctx.device
    torch.set_num_threads(settings.cpus_per_worker * (settings.num_workers if world == 1 else 1))
    # One seed for the adapter's initialisation on every rank: DDP would broadcast rank 0's weights anyway, but
    # FSDP keeps each rank's own shard of what it initialised.
    torch.manual_seed(settings.seed)

    from transformers import AutoModelForCausalLM

    model: Any = AutoModelForCausalLM.from_pretrained(loop.model_dir, dtype=torch.float32, attn_implementation="sdpa")
    if settings.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
    model = get_peft_model(model, settings.lora.peft_config())
    torch.manual_seed(settings.seed + rank)  # distinct dropout streams per rank
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    plan = _plan_strategy(settings, device, world, sum(p.numel() for p in model.parameters()), trainable)
    if rank == 0:
        print(f"strategy: {plan.strategy} ({plan.reason})", flush=True)

    root = Path(loop.checkpoint_root)
    start = checkpoints.latest(root)
    # The adapter goes into the unsharded model (PEFT's own loader); the optimizer state, keyed by parameter name,
    # is loaded once the optimizer exists over the final (possibly sharded) parameters.
    state = _load_adapter(start.path, model) if start else {}
    fsdp = plan.strategy == "fsdp"
    with _process_group(device, world) if fsdp else nullcontext():
        model = _shard(model, device, world) if fsdp else ctx.prepare_model(model)
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=settings.learning_rate, weight_decay=settings.weight_decay)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, settings))
        if start:
            _restore_state(state, model, optimizer, scheduler, rank)
            print(
                f"rank {rank}: resumed from {start.path.name} (step {start.step}), saved under "
                f"{state['strategy']}, training under {plan.strategy}",
                flush=True,
            )
        _train(loop, ctx, plan, model, optimizer, scheduler, params, start.step if start else 0)


def _train(
    loop: LoopConfig,
    ctx: WorkerContext,
    plan: strategies.Plan,
    model: Any,
    optimizer: Any,
    scheduler: Any,
    params: list[Any],
    first_step: int,
) -> None:
    """Steps `first_step`..max_steps with logging, progress, stop requests and checkpoint commits (rank 0 writes)."""
    import torch

    from steps.common.modeling import collate, encode_example, load_tokenizer

    settings = loop.settings
    rank, world, device = ctx.rank, ctx.world, ctx.device
    root = Path(loop.checkpoint_root)
    tokenizer = load_tokenizer(Path(loop.model_dir))
    examples = [
        encode_example(tokenizer, e.prompt, e.completion, settings.max_seq_len)
        for e in load_examples(Path(loop.train_file))
    ]
    if rank == 0 and loop.progress_file:
        os.environ["ARGO_PROGRESS_FILE"] = loop.progress_file
    progress = Progress(settings.max_steps, "train", min_interval_s=0.0 if world == 1 else 2.0) if rank == 0 else None
    if progress:
        progress.advance(first_step)
    durable = checkpoints.DurableCopy(loop.checkpoint_uri) if rank == 0 and loop.checkpoint_uri else None
    # FSDP on GPU casts through its MixedPrecisionPolicy instead (see _shard).
    bf16_autocast = device.type == "cuda" and plan.strategy == "ddp"
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if bf16_autocast else nullcontext()
    window_loss, window_steps, tokens, started = 0.0, 0, 0, time.perf_counter()
    last_commit = time.monotonic()
    metrics: dict[str, float] = {}
    stop_file = root / STOP_FILE
    try:
        for step in range(first_step, settings.max_steps):
            model.train()
            step_loss = 0.0
            for micro in range(settings.grad_accum_steps):
                ids = batch_indices(step, micro, rank, settings, world, len(examples))
                pad = tokenizer.pad_token_id
                batch = {k: v.to(device) for k, v in collate([examples[i] for i in ids], pad).items()}
                tokens += int(batch["attention_mask"].sum())
                with _gradient_sync(model, micro == settings.grad_accum_steps - 1), autocast:
                    loss = model(**batch).loss / settings.grad_accum_steps
                    loss.backward()
                step_loss += float(loss.detach())
            torch.nn.utils.clip_grad_norm_(params, settings.max_grad_norm)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            window_loss, window_steps = window_loss + step_loss, window_steps + 1
            done = step + 1
            if done % settings.log_every == 0 or done == settings.max_steps:
                metrics = _window_metrics(window_loss / window_steps, tokens, started, world, scheduler)
                window_loss, window_steps = 0.0, 0
                if rank == 0 and loop.mlflow_run_id:
                    tracking.log_metrics(loop.tracking_uri, loop.mlflow_run_id, metrics, step=done)
            if progress:
                note = f"loss {step_loss:.6f}"  # this step's loss on rank 0: the kill/resume tests compare it
                progress.advance(note=note)
            minutes = settings.checkpoint_every_minutes
            stop, timed = _agree(
                ctx.stop_requested() or stop_file.exists(),
                bool(minutes) and time.monotonic() - last_commit >= minutes * 60,
            )
            if done % settings.checkpoint_every == 0 or done == settings.max_steps or stop or timed:
                adapter, optimizer_state = _full_state(model, optimizer)  # a collective: every rank takes part
                if rank == 0:
                    save = partial(
                        _save_checkpoint,
                        rank=rank,
                        model=model,
                        adapter=adapter,
                        optimizer_state=optimizer_state,
                        scheduler=scheduler,
                        strategy=plan.strategy,
                    )
                    committed = checkpoints.commit(root, done, partial(save, metrics={"step": done, **metrics}))
                    checkpoints.prune(root, settings.keep_checkpoints)
                    if durable:
                        durable.submit(committed)
                last_commit = time.monotonic()
                ctx.report({"step": done, **metrics})
            if stop:
                print(f"rank {rank}: stop requested; checkpoint step {done} committed, exiting", flush=True)
                return
    finally:
        if durable:
            for error in durable.close():
                print(f"warning: {error}", file=sys.stderr)


def _plan_strategy(
    settings: TrainSettings, device: Any, world: int, num_params: int, trainable: int
) -> strategies.Plan:
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
def _process_group(device: Any, world: int) -> Iterator[None]:
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


def _shard(model: Any, device: Any, world: int) -> Any:
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


def _gradient_sync(model: Any, sync: bool) -> Any:
    """A context for one micro-batch: reduce gradients only on the last one (DDP no_sync; FSDP2's switch)."""
    if hasattr(model, "set_requires_gradient_sync"):  # FSDP2 has no no_sync context
        model.set_requires_gradient_sync(sync)
        return nullcontext()
    return nullcontext() if sync or not hasattr(model, "no_sync") else model.no_sync()


def _agree(*flags: bool) -> tuple[bool, ...]:
    """The OR of each flag over all workers, so every rank stops or checkpoints at the same step."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return flags
    values = torch.tensor([float(f) for f in flags], device=_collective_device())
    dist.all_reduce(values, op=dist.ReduceOp.MAX)
    return tuple(bool(v) for v in values.tolist())


def _collective_device() -> Any:
    """Where a tensor must live for the default process group's collectives: NCCL reduces CUDA tensors only."""
    import torch
    import torch.distributed as dist

    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def _window_metrics(
    local_loss: float, local_tokens: int, started: float, world: int, scheduler: Any
) -> dict[str, float]:
    """Loss averaged over workers, current LR, and throughput of all workers since this attempt started."""
    import torch
    import torch.distributed as dist

    values = torch.tensor([local_loss, float(local_tokens)], dtype=torch.float64)
    if dist.is_available() and dist.is_initialized():
        values = values.to(_collective_device())
        dist.all_reduce(values)
    elapsed = max(time.perf_counter() - started, 1e-9)
    return {
        "loss": float(values[0]) / world,
        "learning_rate": float(scheduler.get_last_lr()[0]),
        "tokens_per_s": float(values[1]) / elapsed,
    }


def _unwrap(model: Any) -> Any:
    return model.module if hasattr(model, "module") else model


def _full_state(model: Any, optimizer: Any) -> tuple[dict[str, Any], dict[str, Any]]:
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


def _save_checkpoint(
    folder: Path,
    rank: int,
    model: Any,
    adapter: dict[str, Any],
    optimizer_state: dict[str, Any],
    scheduler: Any,
    strategy: str,
    metrics: dict[str, float],
) -> None:
    import torch

    if rank != 0:  # per-rank files would collide (RELIABILITY.md): rank 0 holds the gathered full state
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
            "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        },
        folder / STATE_FILE,
    )


def _load_adapter(folder: Path, model: Any) -> dict[str, Any]:
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


def _restore_state(state: dict[str, Any], model: Any, optimizer: Any, scheduler: Any, rank: int) -> None:
    """Optimizer (full state by parameter name, sharded here when the model is), scheduler and RNG streams."""
    import torch
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(model, optimizer, state["optimizer"], options=StateDictOptions(full_state_dict=True))
    scheduler.load_state_dict(state["scheduler"])
    torch.set_rng_state(state["torch_rng"])
    random.setstate(state["python_rng"])
    if state["cuda_rng"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda_rng"])
    if rank:
        torch.manual_seed(int(state["step"]) * 7919 + rank)  # distinct dropout streams per rank


def main(argv: list[str] | None = None) -> int:
    """Entry point: `python -m steps.train --name=value ...`; exits EXIT_PREEMPTED after a SIGTERM checkpoint."""
    try:
        return run_step(Args, run, argv)
    except PreemptedError as err:
        print(f"preempted: {err}", file=sys.stderr)
        return EXIT_PREEMPTED


if __name__ == "__main__":
    raise SystemExit(main())
