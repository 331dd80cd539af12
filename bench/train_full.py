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
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

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


def report(path: str) -> int:
    """Per-round ratios of eksflow's full fine-tune to its peers (RATIOS), each variant's figures, then medians."""
    runs = json.loads(Path(path).read_text(encoding="utf-8"))["runs"]
    by_round: dict[int, dict[str, dict[str, Any]]] = {}
    for variant, results in runs.items():
        for result in results:
            by_round.setdefault(result["round"], {})[variant] = result
    ratios: dict[str, list[float]] = {}
    for number, round_runs in sorted(by_round.items()):
        line = [f"round {number}:"]
        for name, (top, bottom, key) in RATIOS.items():
            if top in round_runs and bottom in round_runs:
                ratio = round_runs[top][key] / round_runs[bottom][key]
                ratios.setdefault(name, []).append(ratio)
                line.append(f"{name} {ratio:.3f}")
        for variant, result in sorted(round_runs.items()):
            line.append(
                f"{variant} {result['tokens_per_s']:.1f} tok/s {result['tree_peak_rss_mb']:.0f} MiB "
                f"cpu-pressure {result['cpu_pressure_some'] or 0:.2f}"
            )
        print("  ".join(line))
    for variant, results in runs.items():
        if results:
            print(f"median {variant}: {statistics.median(r['tokens_per_s'] for r in results):.1f} tok/s")
    for name, values in ratios.items():
        print(f"median {name}: {statistics.median(values):.3f} ({', '.join(f'{v:.3f}' for v in values)})")
    return 0


def main() -> int:
    """Run the harness's `bare` or `hf` variant on the whole model (printing its RESULT line), or `report`."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("variant", choices=("bare", "hf", "report"))
    parser.add_argument("--results", default=os.path.join(train_peers.OUT_DIR, "results.json"), help="for report")
    parsed = parser.parse_args()
    variant = parsed.variant
    if variant == "report":
        return report(parsed.results)
    train_peers.build_model = whole_model  # run_bare and run_hf look it up when they run
    harness = argparse.Namespace(
        variant=variant,
        steps=int(os.environ["BENCH_STEPS"]),
        warmup=int(os.environ["BENCH_WARMUP"]),
        threads=int(os.environ["BENCH_THREADS"]),
    )
    train_peers.child_main(harness)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
