"""The dataset format every step shares: JSON lines of {"prompt": str, "completion": str}, in two splits.

    <dataset_dir>/train.jsonl      one JSON object per line; blank lines are ignored
    <dataset_dir>/eval.jsonl       held out: no prompt of it occurs in train.jsonl
    <dataset_dir>/manifest.json    written by stage_data: path, size and sha256 of each file, and the dataset digest

Other keys in a record are allowed and ignored.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from steps.common.args import StepInputError

TRAIN_FILE = "train.jsonl"
EVAL_FILE = "eval.jsonl"
MANIFEST_FILE = "manifest.json"
SPLITS = {"train": TRAIN_FILE, "eval": EVAL_FILE}  # split name -> file name inside the dataset folder
FIELDS = ("prompt", "completion")


@dataclass(frozen=True)
class Example:
    """One training or evaluation pair."""

    prompt: str
    completion: str


@dataclass(frozen=True)
class Line:
    """One non-blank line of a JSONL file: the parsed object, or why it could not be parsed."""

    number: int  # 1-based, as an editor shows it
    record: dict[str, Any] | None
    error: str | None


def read_lines(path: Path) -> Iterator[Line]:
    """Parse `path` line by line; malformed JSON, non-UTF-8 bytes and non-objects become `Line.error`, never raise."""
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            try:
                # utf-8-sig on the first line: editors on Windows prepend a byte-order mark
                text = raw.decode("utf-8-sig" if number == 1 else "utf-8")
            except UnicodeDecodeError as err:
                yield Line(number, None, f"not UTF-8: byte 0x{raw[err.start]:02x} at column {err.start + 1}")
                continue
            try:
                value = json.loads(text.rstrip("\r\n"))  # so error columns count within the line
            except json.JSONDecodeError as err:
                yield Line(number, None, f"malformed JSON: {err.msg} at column {err.colno}")
                continue
            if not isinstance(value, dict):
                yield Line(number, None, f"expected a JSON object, got {type(value).__name__}")
                continue
            yield Line(number, value, None)


def example_error(record: dict[str, Any]) -> str | None:
    """Why `record` is not a usable Example (missing, non-string or blank field), or None."""
    for field in FIELDS:
        if field not in record or record[field] is None:
            return f"missing {field!r}"
        if not isinstance(record[field], str):
            return f"{field!r} is a {type(record[field]).__name__}, expected a string"
        if not record[field].strip():
            return f"{field!r} is blank"
    return None


def load_examples(path: Path) -> list[Example]:
    """The usable examples of a split file.

    Lines that are not usable are skipped with one warning on stderr: validate_data fails on them unless its
    `mostly` tolerance lets a few through, and then training must not trip over them.
    """
    if not path.is_file():
        raise StepInputError(f"dataset file {str(path)!r} does not exist; did stage_data and validate_data run?")
    examples: list[Example] = []
    skipped: list[str] = []
    for line in read_lines(path):
        error = line.error if line.record is None else example_error(line.record)
        if error is not None or line.record is None:
            skipped.append(f"line {line.number}: {error}")
            continue
        examples.append(Example(prompt=line.record["prompt"], completion=line.record["completion"]))
    if skipped:
        print(f"warning: skipped {len(skipped)} unusable line(s) in {path} (first: {skipped[0]})", file=sys.stderr)
    if not examples:
        raise StepInputError(f"{str(path)!r} holds no usable examples; expected JSON lines of prompt/completion")
    return examples
