"""Write the demo dataset: rewrite a date written in one of several styles as ISO 8601 (YYYY-MM-DD).

    python scripts/make_demo_data.py            # -> data/demo/{train,eval}.jsonl

The base SmolLM2-135M-Instruct answers in prose or with a timestamp, so it scores near zero on exact match;
a few hundred LoRA steps on CPU teach it the format and the month arithmetic. Deterministic (fixed seed), and
the eval dates never occur in train, so the held-out score measures generalisation, not recall.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import random
from pathlib import Path

MONTHS = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
]
INSTRUCTION = "Rewrite this date in ISO 8601 format (YYYY-MM-DD). Answer with the date only."


def ordinal(day: int) -> str:
    """1 -> 1st, 2 -> 2nd, 11 -> 11th, 23 -> 23rd."""
    suffix = "th" if 11 <= day % 100 <= 13 else {1: "st", 2: "nd", 3: "rd"}.get(day % 10, "th")
    return f"{day}{suffix}"


def render(date: dt.date, style: int) -> str:
    """One of six unambiguous human spellings of `date`."""
    month = MONTHS[date.month - 1]
    return [
        f"{month} {date.day}, {date.year}",
        f"{date.day} {month} {date.year}",
        f"{month[:3]} {date.day}, {date.year}",
        f"the {ordinal(date.day)} of {month}, {date.year}",
        f"{date.day:02d}.{date.month:02d}.{date.year}",
        f"{month} {ordinal(date.day)} {date.year}",
    ][style]


def make_examples(n: int, rng: random.Random, taken: set[dt.date]) -> list[dict[str, str]]:
    """`n` examples with dates not in `taken` (which is updated), spread over 1950-2049."""
    examples = []
    while len(examples) < n:
        date = dt.date(1950, 1, 1) + dt.timedelta(days=rng.randrange(36525))
        if date in taken:
            continue
        taken.add(date)
        text = render(date, rng.randrange(6))
        examples.append({"prompt": f"{INSTRUCTION}\nDate: {text}", "completion": date.isoformat()})
    return examples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("data/demo"))
    parser.add_argument("--train", type=int, default=480)
    parser.add_argument("--eval", type=int, default=48)
    parser.add_argument("--seed", type=int, default=20261130)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    taken: set[dt.date] = set()
    splits = {"eval": make_examples(args.eval, rng, taken), "train": make_examples(args.train, rng, taken)}
    args.out.mkdir(parents=True, exist_ok=True)
    for split, examples in splits.items():
        path = args.out / f"{split}.jsonl"
        path.write_text("".join(json.dumps(e) + "\n" for e in examples), encoding="utf-8")
        print(f"wrote {len(examples)} examples to {path}")


if __name__ == "__main__":
    main()
