"""Crash-safe checkpoints: a checkpoint is visible only once every file in it is written and verified.

Commit protocol (what HF Trainer and torchtune lack, see docs/reliability.md CK1-CK3):
    1. write every file into `<root>/.tmp-step-<N>-<pid>/` and fsync it;
    2. write `manifest.json` (size + sha256 of each file) LAST, fsync it;
    3. rename the folder to `<root>/step-<N>` and fsync `<root>`.
`latest()` returns the highest-numbered `step-<N>` (numeric order) whose manifest verifies; partial, temporary and
corrupt folders are skipped with a log line. Retention deletes old checkpoints only after a newer one is committed,
so at least one complete checkpoint exists at every moment.

Durable copy (`DurableCopy`): for an s3:// checkpoint location, a background thread uploads each committed folder
to `<uri>/step-<N>/` and writes the `COMMITTED` marker object LAST, so a reader that sees the marker sees every
file; `restore_latest` brings the newest marked copy back when the local root has none (a new node after Spot).
Training never waits for an upload except at the end (`close`).
"""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from eksflow.llm.steps.common.s3errors import explain, s3_errors
from eksflow.llm.steps.common.storage import (
    UnsafeKeyError,
    download_prefix,
    fsync,
    fsync_dir,
    s3_client,
    sha256_file,
    split_s3,
)

MANIFEST = "manifest.json"
MARKER = "COMMITTED"  # the object written last in a durable copy
_STEP_DIR = re.compile(r"^step-(\d+)$")


class CorruptCheckpointError(Exception):
    """A checkpoint whose files do not match its manifest."""


@dataclass(frozen=True)
class Checkpoint:
    """A committed checkpoint folder and the training step it was taken after."""

    path: Path
    step: int


def commit(root: Path, step: int, write: Callable[[Path], None]) -> Checkpoint:
    """Let `write` fill a temporary folder, then publish it as `root/step-<step>` with a manifest."""
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:08d}"
    tmp = root / f".tmp-step-{step:08d}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    write(tmp)
    files = sorted(p for p in tmp.rglob("*") if p.is_file())
    for path in files:
        fsync(path)
    manifest = {
        "step": step,
        "files": {str(p.relative_to(tmp)): {"size": p.stat().st_size, "sha256": sha256_file(p)} for p in files},
    }
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True), encoding="utf-8")
    fsync(tmp / MANIFEST)
    if final.exists():  # the same step committed before a crash: the new copy is equivalent
        shutil.rmtree(final)
    os.replace(tmp, final)
    fsync_dir(root)
    return Checkpoint(final, step)


def verify(path: Path) -> None:
    """Raise CorruptCheckpointError unless every file listed in the manifest exists with its size and sha256."""
    manifest_path = path / MANIFEST
    if not manifest_path.is_file():
        raise CorruptCheckpointError(f"{path} has no {MANIFEST}: the save did not finish")
    try:
        files = json.loads(manifest_path.read_text(encoding="utf-8"))["files"]
    except (ValueError, KeyError) as err:
        raise CorruptCheckpointError(f"{manifest_path} is unreadable: {err}") from err
    for name, meta in files.items():
        file = path / name
        if not file.is_file() or file.stat().st_size != meta["size"]:
            raise CorruptCheckpointError(f"{file} is missing or has the wrong size")
        if sha256_file(file) != meta["sha256"]:
            raise CorruptCheckpointError(f"{file} does not match its sha256 in the manifest")


def committed(root: Path) -> list[Checkpoint]:
    """Checkpoint folders under `root` in numeric step order (not yet verified)."""
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = _STEP_DIR.match(child.name)
        if match and child.is_dir():
            found.append(Checkpoint(child, int(match.group(1))))
    return sorted(found, key=lambda c: c.step)


def latest(root: Path) -> Checkpoint | None:
    """The newest checkpoint that verifies; skipped ones are reported on stderr."""
    for checkpoint in reversed(committed(root)):
        try:
            verify(checkpoint.path)
        except CorruptCheckpointError as err:
            print(f"skipping checkpoint {checkpoint.path.name}: {err}", file=sys.stderr)
            continue
        return checkpoint
    return None


def prune(root: Path, keep: int) -> list[Path]:
    """Delete all but the newest `keep` checkpoints, and stale temporary folders; return what was deleted."""
    removed = []
    for checkpoint in committed(root)[:-keep]:
        shutil.rmtree(checkpoint.path, ignore_errors=True)
        removed.append(checkpoint.path)
    for stale in root.glob(".tmp-step-*"):
        if not stale.name.endswith(f"-{os.getpid()}"):
            shutil.rmtree(stale, ignore_errors=True)
            removed.append(stale)
    return removed


class DurableCopy:
    """Upload committed checkpoints to an s3:// prefix in a background thread, marker last; newest wins.

    Only the newest pending checkpoint is uploaded: if training commits faster than the upload, the older pending
    one is skipped (it would be superseded anyway). Upload errors are logged and remembered, never raised into the
    training loop; `close()` waits for the last upload and returns the errors.
    """

    def __init__(self, uri: str) -> None:
        self.bucket, prefix = split_s3(uri)
        self.prefix = prefix.rstrip("/")
        self.errors: list[str] = []
        self.uploaded: list[int] = []
        self._pending: queue.Queue[Checkpoint | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="durable-checkpoint-copy", daemon=True)
        self._thread.start()

    def submit(self, checkpoint: Checkpoint) -> None:
        """Queue a committed checkpoint for upload; returns at once."""
        self._pending.put(checkpoint)

    def close(self) -> list[str]:
        """Finish the queued uploads and stop the thread; return the upload errors (empty when all succeeded)."""
        self._pending.put(None)
        self._thread.join()
        return self.errors

    def _run(self) -> None:
        client = s3_client()
        while True:
            item = self._pending.get()
            while item is not None and not self._pending.empty():
                newer = self._pending.get()  # skip to the newest; a None (close) still ends the loop after it
                if newer is None:
                    self._upload(client, item)
                    return
                item = newer
            if item is None:
                return
            self._upload(client, item)

    def _upload(self, client: object, checkpoint: Checkpoint) -> None:
        base = f"{self.prefix}/{checkpoint.path.name}" if self.prefix else checkpoint.path.name
        try:
            for path in sorted(p for p in checkpoint.path.rglob("*") if p.is_file()):
                key = f"{base}/{path.relative_to(checkpoint.path).as_posix()}"
                client.upload_file(str(path), self.bucket, key)  # type: ignore[attr-defined]
            client.put_object(Bucket=self.bucket, Key=f"{base}/{MARKER}", Body=b"")  # type: ignore[attr-defined]
        except Exception as err:  # a durable-copy outage must not stop training; the local commit stands
            explained = explain(err, f"durable copy of {checkpoint.path.name} to", f"s3://{self.bucket}/{base}")
            message = str(explained) if explained else f"durable copy of {checkpoint.path.name} failed: {err}"
            print(f"warning: {message}", file=sys.stderr)
            self.errors.append(message)
            return
        self.uploaded.append(checkpoint.step)


def restore_latest(uri: str, root: Path) -> Checkpoint | None:
    """Download the newest durable copy under `uri` that has its marker and verifies into `root`; None if none."""
    bucket, prefix = split_s3(uri)
    base = prefix.rstrip("/") + "/" if prefix else ""
    marked: list[tuple[int, str]] = []
    with s3_errors("listing durable checkpoints under", uri):
        client = s3_client()
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=base):
            for obj in page.get("Contents", []):
                parts = obj["Key"][len(base) :].split("/")
                match = _STEP_DIR.match(parts[0])
                if match and parts[1:] == [MARKER]:
                    marked.append((int(match.group(1)), parts[0]))
    for step, name in sorted(marked, reverse=True):
        tmp = root / f".tmp-restore-{name}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            download_prefix(f"s3://{bucket}/{base}{name}", tmp, skip=frozenset({MARKER}), client=client)
        except UnsafeKeyError as err:
            raise CorruptCheckpointError(f"durable copy {name}: {err}") from err
        try:
            verify(tmp)
        except CorruptCheckpointError as err:
            print(f"skipping durable copy {name}: {err}", file=sys.stderr)
            shutil.rmtree(tmp, ignore_errors=True)
            continue
        final = root / name
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        fsync_dir(root)
        return Checkpoint(final, step)
    return None
