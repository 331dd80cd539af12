"""A single data file split into train/eval by a hash of each prompt, records normalized to prompt/completion."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, BinaryIO

from steps.common.data import EVAL_FILE, TRAIN_FILE, normalize_record, split_of
from steps.common.storage import sha256_file
from steps.stage_data.manifest import ManifestEntry


def derive(raw: Path, inputs: tuple[str, ...], into: Path, eval_fraction: float) -> list[ManifestEntry]:
    """Write train.jsonl and eval.jsonl in prompt/completion form from the staged `inputs` under `raw`.

    Lines that are not JSON objects in a known form are written unchanged, so validate_data counts and shows them.
    A split file that needs no change is hard-linked to its raw copy rather than written twice.
    """
    outputs = {TRAIN_FILE: into / TRAIN_FILE, EVAL_FILE: into / EVAL_FILE}
    if len(inputs) == 2:
        for name, path in zip(outputs, inputs, strict=True):
            with open(raw / path, "rb") as src, open(outputs[name], "xb") as out:
                rewritten = sum(_write_line(line, out) for line in src)
                out.flush()
                os.fsync(out.fileno())
            if not rewritten:
                outputs[name].unlink()
                os.link(raw / path, outputs[name])
    else:
        with (
            open(raw / inputs[0], "rb") as src,
            open(outputs[TRAIN_FILE], "xb") as train,
            open(outputs[EVAL_FILE], "xb") as held_out,
        ):
            for line in src:
                key = _split_key(line)
                if key is not None:
                    _write_line(line, held_out if split_of(key, eval_fraction) == "eval" else train)
            for out in (train, held_out):
                out.flush()
                os.fsync(out.fileno())
    entries = []
    for name, output in outputs.items():
        size, sha256 = output.stat().st_size, sha256_file(output)
        entries.append(ManifestEntry(name, size, sha256))
    return entries


def _normalized(line: bytes) -> dict[str, Any] | None:
    try:
        record = json.loads(line)
    except ValueError:  # includes UnicodeDecodeError: left for validate_data to report
        return None
    return normalize_record(record) if isinstance(record, dict) else None


def _write_line(line: bytes, out: BinaryIO) -> bool:
    """Write `line` normalized (True) or unchanged (False); blank lines are dropped, a last newline added."""
    if not line.strip():
        return True
    record = _normalized(line)
    if record is None:
        out.write(line if line.endswith(b"\n") else line + b"\n")
        return not line.endswith(b"\n")
    out.write(json.dumps(record, ensure_ascii=False).encode() + b"\n")
    return True


def _split_key(line: bytes) -> str | None:
    """What decides a row's split: its prompt when it has one, else the line itself (kept for validate_data)."""
    if not line.strip():
        return None
    record = _normalized(line)
    if record is None:
        try:
            parsed = json.loads(line)
        except ValueError:
            parsed = None
        record = parsed if isinstance(parsed, dict) else {}
    prompt = record.get("prompt")
    return prompt if isinstance(prompt, str) else line.decode("utf-8", "replace").strip()
