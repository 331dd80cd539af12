"""Copying the listed files into a new version, or linking them from the previous one when unchanged."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from stat import S_ISREG
from typing import Any, TypeVar

from eksflow.llm.steps.common.data import EVAL_FILE, TRAIN_FILE
from eksflow.llm.steps.common.storage import fsync
from eksflow.llm.steps.stage_data.manifest import ManifestEntry
from eksflow.llm.steps.stage_data.sources import Source, SourceFile
from eksflow.runtime.outputs import Progress


def reuse_derived(manifest: dict[str, Any], split: dict[str, Any], old_dir: Path, into: Path) -> list[ManifestEntry]:
    """Link the previous train.jsonl and eval.jsonl into `into` when they came from the same inputs and split."""
    if not manifest or manifest.get("split") != split:
        return []
    entries = [ManifestEntry(str(d["path"]), int(d["size"]), str(d["sha256"])) for d in manifest.get("derived", [])]
    if sorted(e.path for e in entries) != sorted((TRAIN_FILE, EVAL_FILE)):
        return []
    for entry in entries:
        old = old_dir / entry.path
        if old.is_symlink() or not old.is_file() or old.stat().st_size != entry.size:
            return []
    for entry in entries:
        _link_or_copy(old_dir / entry.path, into / entry.path)
    return entries


def _link_or_copy(old: Path, new: Path) -> None:
    new.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(old, new)
    except OSError:
        shutil.copyfile(old, new)  # a file system without hard links: still no download
        fsync(new)


def reuse(
    file: SourceFile, previous: dict[str, ManifestEntry], old_dir: Path, into: Path, source: Source
) -> ManifestEntry | None:
    """Link the published copy of `file` into `into` when its size and ETag match the previous manifest."""
    entry = previous.get(file.path)
    if entry is None or not file.etag or entry.etag != file.etag or entry.size != file.size:
        return None
    old = old_dir / file.path
    try:
        copied = old.lstat()
    except OSError:
        return None
    if not S_ISREG(copied.st_mode) or copied.st_size != file.size or not source.unchanged_since(file, copied):
        return None
    _link_or_copy(old, into / file.path)
    return entry


def copy_all(
    files: Sequence[SourceFile],
    source: Source,
    into: Path,
    concurrency: int,
    previous: dict[str, ManifestEntry] | None = None,
    old_dir: Path | None = None,
) -> tuple[list[ManifestEntry], int]:
    """Copy (or reuse) `files` with `concurrency` threads; return the entries and how many were copied.

    The first error cancels what has not started and is raised.
    """
    entries: list[ManifestEntry] = []
    todo: list[SourceFile] = []
    for file in files:
        kept = reuse(file, previous, old_dir, into, source) if previous and old_dir is not None else None
        if kept is None:
            todo.append(file)
        else:
            entries.append(kept)
    pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="stage")
    try:
        with Progress(len(todo), "stage_data") as progress:
            for entry in completed(pool, lambda f: source.copy(f, into), todo, window=2 * concurrency):
                entries.append(entry)
                progress.advance(note=entry.path)
    finally:
        # waits for the copies in flight, so the caller may delete `into` afterwards
        pool.shutdown(wait=True, cancel_futures=True)
    return sorted(entries, key=lambda e: e.path), len(todo)


T = TypeVar("T")
R = TypeVar("R")


def completed(pool: ThreadPoolExecutor, task: Callable[[T], R], items: Iterable[T], *, window: int) -> Iterator[R]:
    """`task(item)` for every item on `pool`, results as they finish, with at most `window` submitted and unread.

    Submitting as slots free up (rather than every file at once) keeps memory and the cancel-on-error backlog to
    `window` futures whatever the number of files; twice the pool size keeps every thread busy.
    """
    pending: set[Future[R]] = set()
    for item in items:
        pending.add(pool.submit(task, item))
        if len(pending) >= window:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            yield from (future.result() for future in done)
    while pending:
        done, pending = wait(pending, return_when=FIRST_COMPLETED)
        yield from (future.result() for future in done)
