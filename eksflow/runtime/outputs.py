"""The Argo file contract: one file per output parameter, and `N/M` progress in $ARGO_PROGRESS_FILE."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import sys
import time
from pathlib import Path
from types import TracebackType

from pydantic import BaseModel


def output_text(value: object) -> str:
    """An output parameter value as Argo shows it: booleans lower-case, containers as JSON, floats in full.

    A float is written as Python's shortest round-trip form (`5e-05`, `0.979166`), which Argo's expression
    language and Prometheus gauges parse: rounding here would turn a learning rate of 5e-5 into "0.0001".
    """
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, sort_keys=True)
    return str(value)


def write_outputs(outputs_dir: Path, outputs: BaseModel) -> None:
    """Write each field of `outputs` to `outputs_dir/<name>`; a reader never sees a half-written file."""
    outputs_dir.mkdir(parents=True, exist_ok=True)
    for name, value in outputs.model_dump().items():
        atomic_write_text(outputs_dir / name, output_text(value))


def atomic_write_text(path: Path, text: str) -> None:
    """Write to a temporary sibling of this writer's own, fsync, then rename over `path`.

    Writers racing on one path (two evaluations keeping the same base-model answers) each rename a whole file. On
    failure (a full disk, a read-only folder) the OSError propagates, `path` is as it was, and the temporary file is
    removed.
    """
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        with open(tmp, "x", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


class Progress:
    """Report `done/total` to $ARGO_PROGRESS_FILE (Argo UI, local executor table) and to the log.

    Writes at most every `min_interval_s` seconds, and always the final value; a progress file that cannot be
    written (a full or read-only folder) is skipped.
    """

    def __init__(self, total: int, label: str, *, min_interval_s: float = 2.0) -> None:
        self.total = max(total, 1)
        self.label = label
        self.done = 0
        self._file = os.environ.get("ARGO_PROGRESS_FILE")
        self._min_interval_s = min_interval_s
        self._last_write = 0.0

    def __enter__(self) -> Progress:
        self._write(force=True)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._write(force=True)

    def advance(self, steps: int = 1, note: str = "") -> None:
        """Mark `steps` more units done; `note` (e.g. the loss) goes to the log line."""
        self.done = min(self.done + steps, self.total)
        self._write(force=self.done == self.total, note=note)

    def _write(self, *, force: bool = False, note: str = "") -> None:
        now = time.monotonic()
        if not force and now - self._last_write < self._min_interval_s:
            return
        self._last_write = now
        if self._file:
            with contextlib.suppress(OSError):  # a display only: a full disk fails the outputs, not the work
                Path(self._file).parent.mkdir(parents=True, exist_ok=True)
                atomic_write_text(Path(self._file), f"{self.done}/{self.total}")
        suffix = f" {note}" if note else ""
        print(f"[{self.label}] {self.done}/{self.total}{suffix}", file=sys.stderr, flush=True)
