"""A Secret a task mounts, as its process sees it locally: a read-only copy of the Secret's folder, per attempt.

On a cluster the kubelet projects a Secret into each pod as a read-only volume. Here the Secret's folder (this
machine's <state>/secrets/<name>, or the run's volume the local fleet writes keys into: eksflow.local.model.Mount)
is copied into the task's folder when an attempt starts and removed when it ends: the Secret's regular files only
(no link is followed, no folder below), each 0400 in a folder 0500. A step can neither change the Secret nor reach
anything through it; even a process the modes do not stop (one running as root) writes only its own copy.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path

from eksflow.local.model import Mount
from eksflow.local.rundir import writing

COPIES = "secrets"  # in a task's folder: the running attempt's copy of each Secret it mounts


def copy_folder(task_dir: Path, mount: Mount) -> Path:
    """Where the attempt's copy of a Secret mount is: the folder its mount path maps to."""
    copy = task_dir / COPIES / mount.folder
    return copy / mount.sub_path if mount.sub_path else copy


@contextlib.contextmanager
def read_only_secrets(mounts: Sequence[Mount], host_folder: Callable[[Mount], str], task_dir: Path) -> Iterator[None]:
    """Inside: each Secret of `mounts` copied from its host folder to `copy_folder`; after: every copy removed."""
    try:
        for mount in mounts:
            if mount.scope == "secret":
                source = Path(host_folder(replace(mount, sub_path="")))
                with writing(task_dir / COPIES):
                    _copy(source, task_dir / COPIES / mount.folder)
        yield
    finally:
        _remove(task_dir / COPIES)


def _copy(source: Path, copy: Path) -> None:
    _remove(copy)
    copy.mkdir(parents=True, mode=0o700)
    for entry in os.scandir(source):
        if not entry.is_file(follow_symlinks=False):
            continue
        try:
            reader = os.open(entry.path, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            continue  # replaced by a link or removed since it was listed: not part of the Secret
        with os.fdopen(reader, "rb") as file:
            data = file.read()
        writer = os.open(copy / entry.name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
        with os.fdopen(writer, "wb") as file:
            file.write(data)
    copy.chmod(0o500)


def _remove(folder: Path) -> None:
    """Remove a folder of copies, whose folders the copying made read-only."""
    if not folder.is_dir() or folder.is_symlink():
        return
    for inner, _, _ in os.walk(folder):
        os.chmod(inner, 0o700)
    shutil.rmtree(folder, ignore_errors=True)
