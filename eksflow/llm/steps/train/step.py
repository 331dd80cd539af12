"""The train step's driver: checks, the lease, the MLflow run, Ray Train (or one local worker), and the outputs."""

from __future__ import annotations

import math
import os
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from eksflow.llm.steps.common import chat_template, checkpoints, lease, tracking
from eksflow.llm.steps.common.base_model import resolve_model
from eksflow.llm.steps.common.data import TRAIN_FILE
from eksflow.llm.steps.train import EXIT_PREEMPTED, MAX_FAILURES, Args, Launcher, Outputs, TrainSettings, mpi
from eksflow.llm.steps.train.data import prepare_cache
from eksflow.llm.steps.train.loop import (
    STOP_FILE,
    LoopConfig,
    local_context,
    sigterm_received,
    train_loop,
    train_worker,
)
from eksflow.llm.steps.train.state import read_metrics, trained_folder
from eksflow.runtime.args import StepFailedError, StepInputError, run_step
from eksflow.runtime.ports import free_port

RUN_ID_FILE = "mlflow_run_id"


def _cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


class PreemptedError(Exception):
    """SIGTERM arrived; a checkpoint was committed and the step should exit with EXIT_PREEMPTED."""


def run(args: Args) -> Outputs:
    """Resolve the base model, start (or join) Ray, train, and return the last committed checkpoint."""
    train_file = args.dataset_dir / TRAIN_FILE
    if not train_file.is_file():
        raise StepInputError(f"{train_file} not found; did the stage step finish? (--dataset-dir={args.dataset_dir})")
    if args.launcher in ("mpi", "torchrun") and mpi.ranks_from_env() is None:
        raise StepInputError(
            "--launcher=mpi runs as a rank of mpirun: `mpirun -np N python -m eksflow.llm.steps.train ...`"
            if args.launcher == "mpi"
            else "--launcher=torchrun runs as a worker of torchrun: `torchrun --nproc-per-node N -m "
            "eksflow.llm.steps.train ...`"
        )
    if args.use_gpu and not _cuda_available():
        raise StepInputError("--use-gpu=true, but this machine has no CUDA GPU; train on CPU with --use-gpu=false")
    model_dir = args.templated(resolve_model(args.base_model, args.model_cache_dir), args.model_cache_dir)
    cache_folder, pad_token_id = prepare_cache(args, model_dir)  # before Ray starts; bad data exits 2 here
    args.output_dir.mkdir(parents=True, exist_ok=True)
    root = (args.output_dir / "checkpoints").resolve()
    try:
        lease.claim_run(root, args.run_name)
        held = lease.acquire(root, args.run_name, wait_s=lease.DEFAULT_TTL_S + lease.HEARTBEAT_S)
    except lease.RunMismatchError as err:
        raise StepInputError(str(err)) from err
    except lease.LeaseHeldError as err:
        raise StepFailedError(str(err)) from err
    try:
        return _run_holding_lease(args, model_dir, root, held, cache_folder, pad_token_id)
    finally:
        held.release()


def _run_holding_lease(
    args: Args, model_dir: Path, root: Path, held: lease.Lease, cache_folder: Path, pad_token_id: int
) -> Outputs:
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
        token_cache=str(cache_folder.resolve()),
        pad_token_id=pad_token_id,
    )
    sigterm_received.clear()
    previous = _on_sigterm(root)
    try:
        with held.kept_alive():
            LAUNCHES[args.launcher](loop, args)
    finally:
        signal.signal(signal.SIGTERM, previous)
    final = checkpoints.latest(root)
    if sigterm_received.is_set() and (final is None or final.step < args.max_steps):
        step = final.step if final else 0
        raise PreemptedError(f"SIGTERM: stopped after step {step}/{args.max_steps} with a committed checkpoint")
    if final is None or final.step < args.max_steps:
        raise RuntimeError(f"training ended without a final checkpoint in {loop.checkpoint_root}")
    metrics = read_metrics(final.path)
    return Outputs(
        adapter_dir=str(trained_folder(final.path, args.finetune)),
        checkpoint_dir=str(final.path),
        final_loss=float(metrics.get("loss", math.nan)),
        tokens_per_s=float(metrics.get("tokens_per_s", 0.0)),
        mlflow_run_id=run_id,
    )


def _on_sigterm(root: Path) -> Any:
    """Install the Spot handler: ask the workers (this process, or Ray's through STOP_FILE) to checkpoint and stop."""

    def handler(signum: int, frame: FrameType | None) -> None:
        sigterm_received.set()
        (root / STOP_FILE).write_text(str(os.getpid()), encoding="utf-8")
        print("SIGTERM: committing a checkpoint after the current step, then exiting", file=sys.stderr, flush=True)

    return signal.signal(signal.SIGTERM, handler)


def _mlflow_run(args: Args) -> str:
    """The run id stored by an earlier attempt of this step, or a new run; "" without a tracking URI.

    An MLflow that cannot start the run fails the step before its first training step (TrackingError, exit 1: a
    retry may find the server up), not after it: evaluate and register need that server, so a model trained
    untracked was trained for nothing (docs/reliability.md ML4).
    """
    stored = args.output_dir / RUN_ID_FILE
    if stored.is_file():
        return stored.read_text(encoding="utf-8").strip()
    if not args.tracking_uri:
        return ""
    with tracking.errors(args.tracking_uri, "starting the training run, before any training step"):
        run_id = tracking.start_run(
            args.tracking_uri,
            args.experiment,
            args.run_name,
            {"eksflow.step": "train", tracking.WORKFLOW_TAG: args.run_name},
        )
    tracking.log_params(args.tracking_uri, run_id, _flat_params(args))
    chat_template.record(args.tracking_uri, run_id, args)  # what `make serve` asks the registered version with
    stored.write_text(run_id, encoding="utf-8")
    return run_id


def _flat_params(args: Args) -> dict[str, object]:
    params: dict[str, object] = args.model_dump(include=set(TrainSettings.model_fields), exclude={"lora", "dpo"})
    params.update({f"lora_{k}": v for k, v in args.lora.model_dump().items()})
    params.update({f"dpo_{k}": v for k, v in args.dpo.model_dump().items()})
    params.update(base_model=args.base_model, dataset_dir=str(args.dataset_dir))
    return params


def _fit(loop: LoopConfig, storage: Path, run_name: str) -> None:
    os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
    os.environ.setdefault("RAY_TRAIN_ENABLE_PRINT_PATCH", "0")  # worker prints once, not twice
    # Each rank's own lines (its host, its resume) differ only in numbers, which Ray's log dedup folds into one
    # line per 5 s window: a rank's line came late, after the restarted group's, or not at all past two workers.
    os.environ.setdefault("RAY_DEDUP_LOGS_ALLOW_REGEX", r"^rank \d+")
    import ray
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    settings = loop.settings
    if not ray.is_initialized():
        address = os.environ.get("RAY_ADDRESS")
        local_cpus = None if address else max(os.cpu_count() or 1, settings.num_workers * settings.cpus_per_worker)
        dashboard_port = None if address else _point_state_api_at_own_dashboard()
        # 128 MiB object store: training data travels as file paths, not Ray objects.
        # The dashboard process serves Ray's state API, which Ray Train's placement-group cleaner polls every second.
        # "local": a Ray of its own, like a RayJob's head; without it ray.init joins any `ray start` cluster on the
        # machine, and refuses num_cpus there.
        ray.init(
            address=address or "local",
            num_cpus=local_cpus,
            include_dashboard=None if address else True,
            dashboard_host="127.0.0.1",
            dashboard_port=dashboard_port,
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
            # GPU workers fill each node's devices; CPU workers go one per node, so every node's cores train
            placement_strategy="PACK" if settings.use_gpu else "SPREAD",
        ),
        # A failed worker group restarts MAX_FAILURES times in this attempt (waiting for a lost node's replacement),
        # then the attempt fails and the workflow's retryStrategy takes over: one budget, checked by `plan`.
        run_config=RunConfig(
            name=run_name, storage_path=str(storage.resolve()), failure_config=FailureConfig(max_failures=MAX_FAILURES)
        ),
    )
    trainer.fit()


def _launch_ray(loop: LoopConfig, args: Args) -> None:
    _fit(loop, args.output_dir / "ray", args.run_name)


def _launch_local(loop: LoopConfig, args: Args) -> None:
    train_worker(loop, local_context(loop.settings))


def _launch_ranks(loop: LoopConfig, args: Args) -> None:
    mpi.lead(loop)  # the other ranks of mpirun or torchrun join this loop (eksflow.llm.steps.train.mpi)


# One way to run the training loop per `--launcher` name.
LAUNCHES: dict[Launcher, Callable[[LoopConfig, Args], None]] = {
    "ray": _launch_ray,
    "local": _launch_local,
    "mpi": _launch_ranks,
    "torchrun": _launch_ranks,
}


def _point_state_api_at_own_dashboard() -> int:
    """Pick the local Ray's dashboard port and make every Ray process's state API ask that dashboard.

    Ray Train's placement-group cleaner polls the state API, which finds its cluster through RAY_ADDRESS or else
    through /tmp/ray/ray_current_cluster: the last `ray start` cluster on the machine, never a `ray.init` one. A
    stale file cost every local training 40 s timeouts and a 12 s stall at shutdown; a live `ray start` cluster
    answered for the wrong Ray. The processes `ray.init` starts inherit this environment.
    """
    port = free_port()
    os.environ["RAY_API_SERVER_ADDRESS"] = f"http://127.0.0.1:{port}"
    return port


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m eksflow.llm.steps.train --name=value ...`; exits EXIT_PREEMPTED after a SIGTERM checkpoint.

    Under mpirun or torchrun every rank enters here: rank 0 runs the step, the others join its training loop
    (eksflow.llm.steps.train.mpi).
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    ranks = mpi.ranks_from_env()
    return _main(argv) if ranks is None else mpi.main(argv, ranks, _main)


def _main(argv: Sequence[str]) -> int:
    try:
        return run_step(Args, run, argv)
    except PreemptedError as err:
        print(f"preempted: {err}", file=sys.stderr)
        return EXIT_PREEMPTED


if __name__ == "__main__":
    raise SystemExit(main())
