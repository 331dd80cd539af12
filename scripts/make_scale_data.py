"""Write a large dataset in the demo format (a date in a human style -> ISO 8601), for benchmarks at scale.

    python scripts/make_scale_data.py --train 1000000 --out /tmp/scale/1m          # train.jsonl + eval.jsonl
    python scripts/make_scale_data.py --train 2000000 --single --out /tmp/big      # one data.jsonl (stage splits it)

The same task and prompt as scripts/make_demo_data.py, over the dates of years 1000-9999 (3.29 million days) so
that a million rows need no repeat: row i takes the date at position (a * i + b) mod D of that range, an affine
permutation (a coprime with D, both from the seed), so every row has its own date and eval dates (the rows after
the train rows) never occur in train, without a set of the dates taken in memory. Rows are written as they are
made (memory stays flat at any size) and the output is a pure function of the arguments: the same command writes
the same bytes. `--spread` appends 0 to N filler sentences to each prompt (uniformly, by the seed) for data whose
lengths vary, where padding costs most and sequence packing helps; 0 (the default) keeps the demo's lengths.
Nothing it writes belongs in the repository: write it under /tmp or a run folder.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import random
import sys
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_demo_data import INSTRUCTION, render  # the demo's styles and wording, not a copy of them

FIRST = dt.date(1000, 1, 1)
DAYS = dt.date(9999, 12, 31).toordinal() - FIRST.toordinal() + 1
FILLER = "Note: the answer must contain the date only, with no other words."


def permutation(seed: int) -> tuple[int, int]:
    """(a, b) of the affine permutation i -> (a * i + b) mod DAYS; a is coprime with DAYS, so no date repeats."""
    rng = random.Random(seed)
    while True:
        a = rng.randrange(DAYS // 3, DAYS)  # far from 1: consecutive rows land on unrelated dates
        if math.gcd(a, DAYS) == 1:
            return a, rng.randrange(DAYS)


def rows(first: int, count: int, seed: int, spread: int) -> Iterator[dict[str, str]]:
    """Rows `first` .. `first + count - 1` of the sequence that `seed` defines (train: 0.., eval: after train)."""
    a, b = permutation(seed)
    for i in range(first, first + count):
        date = dt.date.fromordinal(FIRST.toordinal() + (a * i + b) % DAYS)
        # one generator per row, seeded by (seed, i): a row does not depend on how many rows come before it
        rng = random.Random(seed * 1_000_003 + i)
        prompt = f"{INSTRUCTION}\nDate: {render(date, rng.randrange(6))}"
        if spread:
            prompt += "\n" + " ".join([FILLER] * rng.randrange(spread + 1))
        yield {"prompt": prompt.rstrip(), "completion": date.isoformat()}


def write(path: Path, records: Iterator[dict[str, str]]) -> int:
    """Write `records` as JSON lines; return how many."""
    count = 0
    with open(path, "w", encoding="utf-8") as out:
        for record in records:
            out.write(json.dumps(record) + "\n")
            count += 1
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="folder to write into (created)")
    parser.add_argument("--train", type=int, required=True, help="train rows")
    parser.add_argument("--eval", type=int, default=-1, help="eval rows (default: train/10, at most 10,000)")
    parser.add_argument("--single", action="store_true", help="one data.jsonl holding train and eval rows")
    parser.add_argument("--spread", type=int, default=0, help="up to this many filler sentences per prompt")
    parser.add_argument("--seed", type=int, default=20261130)
    args = parser.parse_args()
    n_eval = min(args.train // 10, 10_000) if args.eval < 0 else args.eval
    if args.train < 1 or n_eval < 0 or args.train + n_eval > DAYS:
        parser.error(f"--train and --eval must add up to 1..{DAYS} rows (one date each)")
    args.out.mkdir(parents=True, exist_ok=True)
    if args.single:
        path = args.out / "data.jsonl"
        count = write(path, rows(0, args.train + n_eval, args.seed, args.spread))
        print(f"wrote {count} rows to {path}")
        return
    for split, first, count in (("train", 0, args.train), ("eval", args.train, n_eval)):
        path = args.out / f"{split}.jsonl"
        print(f"wrote {write(path, rows(first, count, args.seed, args.spread))} rows to {path}")


if __name__ == "__main__":
    main()
