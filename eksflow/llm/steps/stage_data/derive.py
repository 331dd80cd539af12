"""A single data file split into train/eval by a hash of each record's split_key, instruction records made pairs.

Streamed: one line in memory at a time, each line parsed once, and each output hashed as it is written (no second
read of a file that may be several GB), so memory stays flat whatever the size of the data file.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, BinaryIO

from eksflow.llm.steps.common.data import EVAL_FILE, TRAIN_FILE, normalize_record, split_key, split_of
from eksflow.llm.steps.stage_data.manifest import ManifestEntry


class _HashedFile:
    """A file opened for writing that keeps the sha256 and size of what went into it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.file: BinaryIO = open(path, "xb")  # noqa: SIM115  # closed by close(), after the fsync
        self.sha256 = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes) -> None:
        self.file.write(data)
        self.sha256.update(data)
        self.size += len(data)

    def close(self) -> ManifestEntry:
        """Flush, fsync and close; the entry for the manifest."""
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()
        return ManifestEntry(self.path.name, self.size, self.sha256.hexdigest())


def derive(raw: Path, inputs: tuple[str, ...], into: Path, eval_fraction: float) -> list[ManifestEntry]:
    """Write train.jsonl and eval.jsonl from the staged `inputs` under `raw`, instruction records as pairs.

    Every other line (a pair, a conversation with its turns, a preference, a line that is no JSON object or of no
    known type) is written unchanged, so validate_data checks it as it came.
    A split file that needs no change is hard-linked to its raw copy rather than written twice.
    """
    outputs = {TRAIN_FILE: _HashedFile(into / TRAIN_FILE), EVAL_FILE: _HashedFile(into / EVAL_FILE)}
    entries: dict[str, ManifestEntry] = {}
    try:
        if len(inputs) == 2:
            for name, path in zip(outputs, inputs, strict=True):
                with open(raw / path, "rb") as src:
                    rewritten = sum(_write_line(line, _parse(line)[1], outputs[name]) for line in src)
                entries[name] = outputs[name].close()
                if not rewritten:  # what was written is the raw file byte for byte: same entry, one copy
                    (into / name).unlink()
                    os.link(raw / path, into / name)
        else:
            with open(raw / inputs[0], "rb") as src:
                for line in src:
                    if not line.strip():
                        continue
                    parsed, normalized = _parse(line)
                    split = split_of(_split_key(line, parsed, normalized), eval_fraction)
                    _write_line(line, normalized, outputs[EVAL_FILE if split == "eval" else TRAIN_FILE])
            entries = {name: out.close() for name, out in outputs.items()}
    finally:
        for out in outputs.values():
            if not out.file.closed:
                out.file.close()
    return [entries[name] for name in (TRAIN_FILE, EVAL_FILE)]


def _parse(line: bytes) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """(the JSON object on the line, its pair form when it is an instruction record); None for what is not there."""
    try:
        record = json.loads(line)
    except ValueError:  # includes UnicodeDecodeError: left for validate_data to report
        return None, None
    if not isinstance(record, dict):
        return None, None
    return record, normalize_record(record)


def _write_line(line: bytes, normalized: dict[str, Any] | None, out: _HashedFile) -> bool:
    """Write `line` normalized (True) or unchanged (False); blank lines are dropped, a last newline added."""
    if not line.strip():
        return True
    if normalized is None:
        out.write(line if line.endswith(b"\n") else line + b"\n")
        return not line.endswith(b"\n")
    out.write(json.dumps(normalized, ensure_ascii=False).encode() + b"\n")
    return True


def _split_key(line: bytes, parsed: dict[str, Any] | None, normalized: dict[str, Any] | None) -> str:
    """What decides a row's split: its split_key (a pair's prompt, a conversation's history), else the line itself."""
    key = split_key(normalized if normalized is not None else parsed or {})
    return key if key is not None else line.decode("utf-8", "replace").strip()
