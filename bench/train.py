"""Tokens/s of eksflow's train step loop, as a plug-in for the peer harness (bare PyTorch loop, HF Trainer, Ray).

    .venv/bin/python bench/train_peers.py --rounds 2 --steps 4 --warmup 1 --variants bare,hf \
        --extra eksflow='.venv/bin/python bench/train.py'

The harness interleaves the variants round by round and prints tokens/s and ratios; this script runs
`eksflow.llm.steps.train.train_worker` (the loop every Ray Train worker runs, here with `--launcher=local`: one process)
on the harness's model, sequence length, micro-batch, LoRA shape and thread count, and prints `RESULT {...}`.

Same work per step as the peers: every example is longer than BENCH_SEQ tokens and truncated to it, so a step
is BENCH_MB x BENCH_SEQ real tokens (no padding), forward + backward + AdamW. The step's own extras stay in:
gradient clipping, the LR schedule, progress reporting. The one checkpoint is taken after the last step and is
not timed; the interval of a step is the time between the progress lines of consecutive steps.

tokens_per_s counts real tokens, as the train step's own tokens_per_s does: each example's tokens up to the
sequence length, padding left out (here none), as the loop's own micro-batches count them from its token cache.

BENCH_DATA picks other records, those bench/train_trl.py gives TRL (its docstring has the command): `chat`, its
multi-turn conversations (every assistant turn learned); `dpo`, its preference pairs with `method: dpo` (a
micro-batch of BENCH_MB pairs is 2 x BENCH_MB sequences, as in TRL's DPOTrainer); `sft-pairs`, the same pairs'
chosen and rejected sequences as SFT conversations, 2 x BENCH_MB a micro-batch (the same rows a DPO step forwards:
DPO's peak memory against SFT's at the same batch).

BENCH_FINETUNE=full trains every weight (`train.finetune: full`; BENCH_LORA is then unused) instead of the adapter:
the comparison with the harness's peers fine-tuning every weight is bench/train_full.py's.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import TextIO

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from eksflow.llm.steps.common import token_cache
from eksflow.llm.steps.common.data import TRAIN_FILE
from eksflow.llm.steps.train import TrainSettings
from eksflow.llm.steps.train.data import MicroBatches
from eksflow.llm.steps.train.loop import LoopConfig, local_context, train_worker

STEP_LINE = re.compile(r"^\[train\] (\d+)/\d+")


class StepClock:
    """A stderr wrapper that timestamps the train loop's `[train] N/M` progress lines."""

    def __init__(self, inner: TextIO) -> None:
        self.inner = inner
        self.marks: list[float] = []

    def write(self, text: str) -> int:
        """Pass `text` through; timestamp it when it is a progress line."""
        if STEP_LINE.match(text):
            self.marks.append(time.perf_counter())
        return self.inner.write(text)

    def flush(self) -> None:
        """Flush the wrapped stream."""
        self.inner.flush()


def main() -> int:
    """Train BENCH_WARMUP + BENCH_STEPS steps with the harness's settings; print the RESULT line."""
    model_dir = os.environ.get("BENCH_MODEL_DIR") or _demo_model()
    seq, mb = int(os.environ.get("BENCH_SEQ", "256")), int(os.environ.get("BENCH_MB", "4"))
    steps, warmup = int(os.environ.get("BENCH_STEPS", "3")), int(os.environ.get("BENCH_WARMUP", "1"))
    threads = int(os.environ.get("BENCH_THREADS", str(os.cpu_count() or 1)))
    lora = json.loads(os.environ.get("BENCH_LORA", "{}"))
    precision = os.environ.get("BENCH_PRECISION", "auto")  # the step's default: bf16 on a CPU with AMX
    finetune = os.environ.get("BENCH_FINETUNE", "lora")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-train-") as tmp:
        train_file = Path(tmp) / TRAIN_FILE
        data = os.environ.get("BENCH_DATA", "")
        rows = _rows(data, seq)
        train_file.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        total = warmup + steps
        settings = TrainSettings(
            max_steps=total,
            micro_batch_size=2 * mb if data == "sft-pairs" else mb,
            method="dpo" if data == "dpo" else "sft",
            learning_rate=2e-4,
            warmup_steps=0,
            max_seq_len=seq,
            num_workers=1,
            cpus_per_worker=threads,
            precision=precision,
            finetune=finetune,
            checkpoint_every=total,
            log_every=total,
            lora={
                "rank": lora.get("r", 16),
                "alpha": lora.get("lora_alpha", 32),
                "dropout": lora.get("lora_dropout", 0.05),
                "target_modules": tuple(lora.get("target_modules", ("q_proj", "k_proj", "v_proj", "o_proj"))),
            },
        )
        loop = LoopConfig(
            settings=settings,
            model_dir=model_dir,
            train_file=str(train_file),
            checkpoint_root=str(Path(tmp) / "checkpoints"),
            tracking_uri="",
            mlflow_run_id="",
            progress_file="",
        )
        clock = StepClock(sys.stderr)
        sys.stderr = clock
        try:
            train_worker(loop, local_context(settings))
        finally:
            sys.stderr = clock.inner
        tokens = real_tokens(Path(tmp) / token_cache.SUBDIR, settings, loop.pad_token_id)
    # marks[0] is the `0/M` line written just before the first batch; marks[i] the end of step i.
    intervals = [b - a for a, b in zip(clock.marks, clock.marks[1:], strict=False)]
    timed = intervals[warmup:]
    result = {
        "tokens_per_s": statistics.median(n / s for n, s in zip(tokens[warmup:], timed, strict=True)),
        "real_tokens_per_step": tokens[warmup:],
        "intervals": timed,
        "warmup_intervals": intervals[:warmup],
        "startup_s": clock.marks[0] - started,
        "threads": threads,
        "precision": precision,
        "finetune": finetune,
    }
    print("RESULT " + json.dumps(result), flush=True)
    return 0


def real_tokens(cache_dir: Path, settings: TrainSettings, pad_id: int) -> list[int]:
    """The real tokens of each step of one worker, as the loop's micro-batches count them (one micro-batch a step)."""
    import torch

    (folder,) = [p for p in cache_dir.glob("tok-*") if p.is_dir()]  # the loop's one cache (beside its lock file)
    batches = MicroBatches(token_cache.TokenCache.open(folder), settings, pad_id)
    return [batches.get(step, 0, 0, 1, torch.device("cpu")).tokens for step in range(settings.max_steps)]


def _rows(data: str, seq: int) -> list[dict[str, object]]:
    """The train split's records for BENCH_DATA (see the module's docstring)."""
    if not data:
        filler = " ".join(["the quick brown fox jumps over the lazy dog"] * (seq // 4))
        return [{"prompt": f"Describe item {i}.", "completion": f"Item {i}: {filler}"} for i in range(64)]
    import train_trl  # beside this file: the records TRL trains on

    if data == "chat":
        return train_trl.conversations()
    if data == "dpo":
        return train_trl.pairs()
    if data == "sft-pairs":
        return [{"messages": p["prompt"] + p[side]} for p in train_trl.pairs() for side in ("chosen", "rejected")]
    raise SystemExit(f"BENCH_DATA must be chat, dpo or sft-pairs, not {data!r}")


def _demo_model() -> str:
    from eksflow.llm.steps.common.base_model import resolve_model

    return str(resolve_model("smollm2-135m-instruct"))


if __name__ == "__main__":
    raise SystemExit(main())
