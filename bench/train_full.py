"""The peer harness's bare loop and HF Trainer fine-tuning every weight, as `--extra` variants of bench/train_peers.py.

    .venv/bin/python bench/train_peers.py --rounds 3 --steps 3 --warmup 1 --variants '' \
        --extra bare_full='.venv/bin/python bench/train_full.py bare' \
        --extra hf_full='.venv/bin/python bench/train_full.py hf' \
        --extra eksflow_full='BENCH_FINETUNE=full BENCH_PRECISION=fp32 .venv/bin/python bench/train.py'
    .venv/bin/python bench/train_full.py report      # per-round ratios from /tmp/bench-train/results.json

The harness's peers train a LoRA adapter; eksflow's `train.finetune: full` trains the whole model. So that the
comparison is like for like, this runs the harness's own code unchanged (`train_peers.run_bare`, `train_peers.run_hf`,
`train_peers.child_main`) with the one switch a full fine-tune needs: `train_peers.build_model` loads the model as
the harness does (seed 0, fp32, no KV cache) and does not wrap it with peft, so every parameter trains. The bare
loop's AdamW then takes every parameter (it takes those that require gradients); HF Trainer's `adamw_torch` too.
Everything else (model, data, sequence length, micro-batch, learning rate, threads, the step clock) is the harness's.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import round_ratios  # beside this file too
import train_peers  # the harness beside this file


def whole_model() -> Any:
    """The harness's model as `train_peers.build_model` loads it, without the LoRA wrapping: every weight trains."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(train_peers.HF_DIR, torch_dtype=torch.float32)
    model.config.use_cache = False
    return model


# name: (numerator variant, denominator variant, result key), each a ratio per round
RATIOS = {
    "eksflow/HF Trainer tokens/s": ("eksflow_full", "hf_full", "tokens_per_s"),
    "eksflow/bare loop tokens/s": ("eksflow_full", "bare_full", "tokens_per_s"),
    "eksflow/HF Trainer peak RSS": ("eksflow_full", "hf_full", "tree_peak_rss_mb"),
}


def main() -> int:
    """Run the harness's `bare` or `hf` variant on the whole model (printing its RESULT line), or `report`."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("variant", choices=("bare", "hf", "report"))
    parser.add_argument("--results", default=os.path.join(train_peers.OUT_DIR, "results.json"), help="for report")
    parsed = parser.parse_args()
    variant = parsed.variant
    if variant == "report":
        return round_ratios.report(parsed.results, RATIOS, variant_medians=True)
    train_peers.build_model = whole_model  # run_bare and run_hf look it up when they run
    train_peers.child_main(round_ratios.harness_args(variant))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
