"""Copy a dataset (local folder, file:// or s3://) into the shared FSx folder and fingerprint it.

    python -m steps.stage_data --source=s3://bucket/datasets/dates --dest-dir=/fsx/<workflow>/data

The source must hold train.jsonl and eval.jsonl (other files are copied too). The copy lands in a temporary sibling
of dest_dir and is published with a rename, so readers never see a half-written dataset and a rerun replaces the
old one whole. Object keys with `..`, empty or absolute parts, and symlinks leading out of a local source are
refused: nothing is ever written outside dest_dir's parent.

Outputs (one file each under --outputs-dir):
    dataset_dir     the published folder (dest_dir)
    dataset_digest  "sha256:<hex>" over the sorted (path, sha256) pairs: equal digests mean equal data
    num_files       files copied (manifest.json not counted)
    num_bytes       bytes copied
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Protocol

from pydantic import BaseModel, Field

from steps.common.args import Settings, StepArgs, StepInputError, run_step
from steps.common.data import EVAL_FILE, MANIFEST_FILE, TRAIN_FILE
from steps.common.outputs import Progress, atomic_write_text
from steps.common.storage import is_s3, local_path, s3_client, split_s3

CHUNK_BYTES = 1 << 20  # 1 MiB per read: large enough for S3 throughput, small enough for 64 threads
LAYOUT = f"expected <source>/{TRAIN_FILE} and <source>/{EVAL_FILE} (JSON lines of prompt/completion)"


class StageSettings(Settings):
    """Where the dataset comes from (the `data` section of the pipeline config)."""

    source: str = Field("data/demo", description="dataset folder: local path, file:///path or s3://bucket/prefix")
    concurrency: int = Field(8, ge=1, le=64, description="files copied in parallel")


class Args(StageSettings, StepArgs):
    """Settings plus the destination the workflow chooses."""

    dest_dir: Path = Field(description="folder to publish the dataset in, e.g. /fsx/<workflow>/data")


class Outputs(BaseModel):
    """Argo output parameters of stage_data."""

    dataset_dir: str
    dataset_digest: str
    num_files: int
    num_bytes: int


@dataclass(frozen=True)
class SourceFile:
    """One file to copy: its path relative to the source, its listed size, and where to read it."""

    path: str  # POSIX, relative, already checked to stay inside the destination
    size: int
    origin: str  # absolute local path, or the S3 object key


@dataclass(frozen=True)
class ManifestEntry:
    """One copied file as manifest.json records it."""

    path: str
    size: int
    sha256: str


class _Readable(Protocol):
    def read(self, amt: int = ..., /) -> bytes: ...

    def close(self) -> None: ...


Opener = Callable[[str], _Readable]


def manifest_digest(entries: Iterable[ManifestEntry]) -> str:
    """`sha256:<hex>` over the (path, sha256) pairs sorted by path; JSON-encoded so no path can fake a boundary."""
    pairs = sorted((e.path, e.sha256) for e in entries)
    return "sha256:" + hashlib.sha256(json.dumps(pairs, separators=(",", ":")).encode()).hexdigest()


def safe_relative(key: str, source: str) -> str:
    """`key` itself if it is a plain relative POSIX path (so it stays inside the destination), else StepInputError."""
    parts = key.split("/")
    if key.startswith("/") or any(part in ("", ".", "..") for part in parts):
        raise StepInputError(
            f"object {key!r} under {source!r} has an absolute, empty, '.' or '..' path part; refusing to stage it "
            "(rename the object so its key below the prefix is a plain relative path)"
        )
    return key


def check_layout(files: Sequence[SourceFile], source: str) -> None:
    """Refuse a listing without both splits, or with a path that is both a file and a folder."""
    paths = {f.path for f in files}
    missing = [name for name in (TRAIN_FILE, EVAL_FILE) if name not in paths]
    if missing:
        raise StepInputError(f"source {source!r} is missing {' and '.join(missing)}; {LAYOUT}")
    for path in paths:
        clash = next((str(p) for p in PurePosixPath(path).parents if str(p) in paths), None)
        if clash is not None:
            raise StepInputError(f"source {source!r} has {clash!r} both as a file and as a folder of {path!r}")


def list_local(root: Path, source: str) -> list[SourceFile]:
    """Every regular file under `root`, following symlinks only while they stay inside it."""
    if not root.is_dir():
        raise StepInputError(f"source folder {str(root)!r} does not exist or is not a folder; {LAYOUT}")
    real_root = root.resolve(strict=True)
    files: list[SourceFile] = []

    def walk(directory: Path, relative: PurePosixPath, ancestors: frozenset[Path]) -> None:
        for entry in sorted(directory.iterdir()):
            rel = relative / entry.name
            target = entry
            if entry.is_symlink():
                try:
                    target = entry.resolve(strict=True)
                except (OSError, RuntimeError) as err:
                    raise StepInputError(f"symlink {str(rel)!r} in {source!r} is broken ({err}); remove it") from err
                if not target.is_relative_to(real_root):
                    raise StepInputError(
                        f"symlink {str(rel)!r} in {source!r} points outside the source, to {str(target)!r}; "
                        "copy that file into the source folder instead"
                    )
            if target.is_dir():
                real = target.resolve()
                if real in ancestors:
                    raise StepInputError(f"symlink {str(rel)!r} in {source!r} loops back to a parent folder")
                walk(target, rel, ancestors | {real})
            elif target.is_file():
                files.append(SourceFile(str(rel), target.stat().st_size, str(target.resolve())))
            else:
                raise StepInputError(f"{str(rel)!r} in {source!r} is not a regular file or folder; remove it")

    walk(real_root, PurePosixPath(), frozenset({real_root}))
    return files


def list_s3(client: Any, uri: str) -> list[SourceFile]:
    """Every object under the prefix of `uri` (a folder: `s3://b/data` lists `data/...`, never `data2/...`)."""
    from botocore.exceptions import ClientError

    bucket, prefix = split_s3(uri)
    base = prefix.rstrip("/") + "/" if prefix.strip("/") else ""
    files: list[SourceFile] = []
    try:
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=base):
            for obj in page.get("Contents", []):
                relative = obj["Key"][len(base) :]
                if not relative or relative.endswith("/"):
                    continue  # folder markers made by the console
                files.append(SourceFile(safe_relative(relative, uri), int(obj["Size"]), obj["Key"]))
    except ClientError as err:
        code = err.response.get("Error", {}).get("Code", "")
        if code == "NoSuchBucket":
            raise StepInputError(
                f"bucket {bucket!r} of source {uri!r} does not exist; check the name "
                f"(endpoint: {os.environ.get('AWS_ENDPOINT_URL', 'AWS')})"
            ) from err
        if code in ("AccessDenied", "403"):
            raise StepInputError(f"access denied listing {uri!r}; grant s3:ListBucket and s3:GetObject") from err
        raise
    if not files:
        raise StepInputError(f"no objects under {uri!r}; check the prefix: {LAYOUT}")
    return files


def copy_file(file: SourceFile, open_source: Opener, into: Path) -> ManifestEntry:
    """Stream one file into `into`, hashing on the way; fsync, and check the size against the listing."""
    target = into / file.path
    target.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    size = 0
    with closing(open_source(file.origin)) as src, open(target, "xb") as out:
        while chunk := src.read(CHUNK_BYTES):
            digest.update(chunk)
            out.write(chunk)
            size += len(chunk)
        out.flush()
        os.fsync(out.fileno())
    if size != file.size:
        raise RuntimeError(
            f"copied {size} bytes of {file.path!r} but the source listed {file.size}: it changed "
            "during staging; rerun once it is stable"
        )
    return ManifestEntry(file.path, size, digest.hexdigest())


def copy_all(files: Sequence[SourceFile], open_source: Opener, into: Path, concurrency: int) -> list[ManifestEntry]:
    """Copy `files` with `concurrency` threads; the first error cancels what has not started and is raised."""
    entries: list[ManifestEntry] = []
    pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="stage")
    try:
        with Progress(len(files), "stage_data") as progress:
            for future in as_completed([pool.submit(copy_file, f, open_source, into) for f in files]):
                entry = future.result()
                entries.append(entry)
                progress.advance(note=entry.path)
    finally:
        # waits for the copies in flight, so the caller may delete `into` afterwards
        pool.shutdown(wait=True, cancel_futures=True)
    return sorted(entries, key=lambda e: e.path)


def publish(staged: Path, dest: Path) -> None:
    """Rename `staged` to `dest`; an existing `dest` is renamed aside first and deleted once the new one is in."""
    aside: Path | None = None
    if dest.exists() or dest.is_symlink():
        aside = dest.with_name(f".{dest.name}.old-{uuid.uuid4().hex[:12]}")
        os.replace(dest, aside)
    try:
        os.replace(staged, dest)
    except OSError:
        if aside is not None:
            os.replace(aside, dest)
        raise
    if aside is not None:
        _remove(aside)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


def _remove_leftovers(dest: Path) -> None:
    """Delete the temporary siblings a killed earlier run of this step left behind."""
    for pattern in (f".{dest.name}.tmp-*", f".{dest.name}.old-*"):
        for leftover in dest.parent.glob(pattern):
            _remove(leftover)


def stage(source: str, dest: Path, concurrency: int) -> list[ManifestEntry]:
    """List, check, copy and publish `source` at `dest` with its manifest.json; return the manifest entries."""
    if is_s3(source):
        client = s3_client()
        bucket, _ = split_s3(source)
        files = list_s3(client, source)

        def open_source(origin: str) -> _Readable:
            body: _Readable = client.get_object(Bucket=bucket, Key=origin)["Body"]
            return body
    else:
        files = list_local(local_path(source), source)

        def open_source(origin: str) -> _Readable:
            return open(origin, "rb")

    if any(f.path == MANIFEST_FILE for f in files):
        print(f"note: ignoring {MANIFEST_FILE} in {source!r}: staging writes its own", file=sys.stderr)
        files = [f for f in files if f.path != MANIFEST_FILE]
    check_layout(files, source)

    dest.parent.mkdir(parents=True, exist_ok=True)
    _remove_leftovers(dest)
    staged = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
    staged.chmod(0o755)  # mkdtemp makes it private; the train and evaluate pods may run as other users
    try:
        entries = copy_all(files, open_source, staged, concurrency)
        manifest = {
            "source": source,
            "files": [{"path": e.path, "size": e.size, "sha256": e.sha256} for e in entries],
            "digest": manifest_digest(entries),
        }
        atomic_write_text(staged / MANIFEST_FILE, json.dumps(manifest, indent=1) + "\n")
        publish(staged, dest)
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise
    return entries


def run(args: Args) -> Outputs:
    """Stage `args.source` into `args.dest_dir`."""
    dest = args.dest_dir.absolute()
    entries = stage(args.source, dest, args.concurrency)
    digest = manifest_digest(entries)
    num_bytes = sum(e.size for e in entries)
    print(f"staged {len(entries)} files, {num_bytes} bytes, from {args.source} to {dest} ({digest})", file=sys.stderr)
    return Outputs(dataset_dir=str(dest), dataset_digest=digest, num_files=len(entries), num_bytes=num_bytes)


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m steps.stage_data`."""
    return run_step(Args, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
