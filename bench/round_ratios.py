"""What the `--extra` variants of the vendored harness (bench/train_peers.py) share.

Their harness arguments, and the per-round ratios of its results file that their `report` commands print.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from collections.abc import Mapping
from pathlib import Path
from typing import Any

Ratio = tuple[str, str, str]  # numerator variant, denominator variant, result key


def harness_args(variant: str) -> argparse.Namespace:
    """What `train_peers.child_main` takes, from the environment the harness gives each variant's process."""
    return argparse.Namespace(
        variant=variant,
        steps=int(os.environ["BENCH_STEPS"]),
        warmup=int(os.environ["BENCH_WARMUP"]),
        threads=int(os.environ["BENCH_THREADS"]),
    )


def report(path: str, ratios: Mapping[str, Ratio], *, variant_medians: bool = False) -> int:
    """Each round's `ratios` (by name) and every variant's figures, then the medians.

    With `variant_medians`, each variant's median tokens/s too.
    """
    runs = json.loads(Path(path).read_text(encoding="utf-8"))["runs"]
    by_round: dict[int, dict[str, dict[str, Any]]] = {}
    for variant, results in runs.items():
        for result in results:
            by_round.setdefault(result["round"], {})[variant] = result
    measured: dict[str, list[float]] = {}
    for number, round_runs in sorted(by_round.items()):
        line = [f"round {number}:"]
        for name, (top, bottom, key) in ratios.items():
            if top in round_runs and bottom in round_runs:
                ratio = round_runs[top][key] / round_runs[bottom][key]
                measured.setdefault(name, []).append(ratio)
                line.append(f"{name} {ratio:.3f}")
        for variant, result in sorted(round_runs.items()):
            line.append(
                f"{variant} {result['tokens_per_s']:.1f} tok/s {result['tree_peak_rss_mb']:.0f} MiB "
                f"cpu-pressure {result['cpu_pressure_some'] or 0:.2f}"
            )
        print("  ".join(line))
    if variant_medians:
        for variant, results in runs.items():
            if results:
                print(f"median {variant}: {statistics.median(r['tokens_per_s'] for r in results):.1f} tok/s")
    for name, values in measured.items():
        print(f"median {name}: {statistics.median(values):.3f} ({', '.join(f'{v:.3f}' for v in values)})")
    return 0
