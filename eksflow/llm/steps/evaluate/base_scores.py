"""The base model's answers on an eval set, kept in the model cache: scored once, read by every later evaluation.

Every candidate of a sweep, every retrain gated on the same held-out rows and every rerun scores the same base model
on the same rows with the same greedy decoding: the same answers, minutes of decoding each time on CPU. The key
holds all that decides them: the model folder's files (names, sizes, modification times), the examples (a
conversation's turns included), the batch
size, the answer length cap, the thread count, the device, torch and transformers' versions and the source of the
code that decodes and scores. Only the answers and the loss are kept; metrics are computed from them each time, so
a changed or added metric never reads a stale score. A file that cannot be read is scored again and replaced.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from pydantic import BaseModel, ValidationError

from eksflow.llm.steps.common.data import Example
from eksflow.runtime.outputs import atomic_write_text

FOLDER = "base-scores"


class Decoded(BaseModel):
    """A model's completion loss and greedy answers on the eval examples."""

    eval_loss: float
    answers: list[str]
    cut: int = 0  # answers that hit the new-token cap before their end


def cache_file(
    cache_dir: Path,
    model_dir: Path,
    examples: Sequence[Example],
    decoding: dict[str, object],
    code: Sequence[ModuleType],
) -> Path:
    """Where the base model's `Decoded` for these examples, decoding settings and decoding `code` is kept.

    `code`: the modules that decode and score, passed in by the scorer (this module imports none of them).
    """
    import torch
    import transformers

    files = {str(p.relative_to(model_dir)): p.stat() for p in model_dir.rglob("*") if p.is_file()}
    key = {
        "model": [[name, stat.st_size, stat.st_mtime_ns] for name, stat in sorted(files.items())],
        # a conversation's turns decide its answer, not only the prompt that shows them
        "examples": [[e.prompt, e.completion, list(e.messages)] for e in examples],
        "decoding": decoding,
        "versions": [torch.__version__, transformers.__version__],
        "code": [Path(m.__file__).read_text(encoding="utf-8") for m in code if m.__file__],
    }
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()
    return cache_dir / FOLDER / f"{digest}.json"


def read(path: Path) -> Decoded | None:
    """The kept answers, or None when there are none (or they cannot be read)."""
    try:
        return Decoded.model_validate_json(path.read_bytes())
    except (OSError, ValidationError):
        return None


def write(path: Path, decoded: Decoded) -> None:
    """Keep `decoded` at `path`, whole or not at all: a concurrent reader never sees half a file.

    A cache that cannot be written (a read-only volume, a full disk) costs the next evaluation its decoding only.
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, decoded.model_dump_json())
    except OSError as err:
        print(f"warning: the base model's answers were not kept in {path.parent}: {err}", file=sys.stderr)
