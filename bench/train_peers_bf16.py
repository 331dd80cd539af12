"""The peer harness's bare loop and HF Trainer in bf16, as `--extra` variants of bench/train_peers.py.

    .venv/bin/python bench/train_peers.py --rounds 3 --steps 3 --warmup 1 --variants bare,hf \
        --extra bare_bf16='.venv/bin/python bench/train_peers_bf16.py bare' \
        --extra hf_bf16='.venv/bin/python bench/train_peers_bf16.py hf' \
        --extra eksflow='.venv/bin/python bench/train.py' \
        --extra eksflow_fp32='BENCH_PRECISION=fp32 .venv/bin/python bench/train.py'

The harness's peers run in fp32 only; eksflow's train step computes in bf16 where the CPU has AMX
(`train.precision: auto`). So that the comparison is like for like, this runs the harness's own code unchanged
(`train_peers.run_bare`, `train_peers.run_hf`, `train_peers.child_main`) with bf16 switched on the way each peer
offers it: the bare loop's forward and backward under `torch.autocast("cpu", dtype=torch.bfloat16)`, and HF
Trainer with `TrainingArguments(bf16=True)` (Accelerate's CPU autocast). Everything else (model, LoRA, data, batch,
optimizer, threads, the step clock) is the harness's.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import round_ratios  # beside this file too
import train_peers  # the harness beside this file


def main() -> int:
    """Run the harness's `bare` or `hf` variant in bf16 with the harness's BENCH_* settings; print its RESULT line."""
    import torch
    import transformers

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("variant", choices=("bare", "hf"))
    variant = parser.parse_args().variant
    if variant == "bare":
        loop = train_peers.bare_loop

        def bf16_loop(*args: Any, **kwargs: Any) -> Any:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return loop(*args, **kwargs)

        train_peers.bare_loop = bf16_loop
    else:
        arguments = transformers.TrainingArguments

        def bf16_arguments(**kwargs: Any) -> Any:
            return arguments(**kwargs, bf16=True)

        transformers.TrainingArguments = bf16_arguments  # run_hf imports it from transformers when it runs
    train_peers.child_main(round_ratios.harness_args(variant))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
