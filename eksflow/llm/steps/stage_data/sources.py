"""Listing a local folder, file, s3:// prefix or object (keys checked), and reading its files into a folder."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from stat import S_ISREG
from typing import Any, Protocol

from eksflow.llm.steps.common.data import EVAL_FILE, TRAIN_FILE
from eksflow.llm.steps.common.storage import fsync, is_s3, local_path, s3_api_client, sha256_file, split_s3
from eksflow.llm.steps.stage_data import StageSettings
from eksflow.llm.steps.stage_data.manifest import ManifestEntry
from eksflow.runtime.args import StepFailedError, StepInputError

CHUNK_BYTES = 1 << 20  # 1 MiB per read: large enough for S3 throughput, small enough for 64 threads


DATA_FILE = "data.jsonl"  # a folder's single data file, split into train and eval by stage_data


LAYOUT = (
    f"expected <source>/{TRAIN_FILE} and <source>/{EVAL_FILE}, <source>/{DATA_FILE}, or a single .jsonl file or "
    "object (JSON lines of prompt/completion, instruction/input/output or chat messages)"
)


@dataclass(frozen=True)
class SourceFile:
    """One file to copy: its path relative to the source, its listed size and version, and where to read it."""

    path: str  # POSIX, relative, already checked to stay inside the destination
    size: int
    origin: str  # absolute local path, or the S3 object key
    etag: str = ""  # the S3 ETag; for a local file "mtime:<ns>"


class _Readable(Protocol):
    def read(self, amt: int = ..., /) -> bytes: ...

    def close(self) -> None: ...


def safe_relative(key: str, source: str) -> str:
    """`key` itself if it is a plain relative POSIX path (so it stays inside the destination), else StepInputError."""
    parts = key.split("/")
    if key.startswith("/") or any(part in ("", ".", "..") for part in parts):
        raise StepInputError(
            f"object {key!r} under {source!r} has an absolute, empty, '.' or '..' path part; refusing to stage it "
            "(rename the object so its key below the prefix is a plain relative path)"
        )
    return key


def check_layout(files: Sequence[SourceFile], source: str, *, single: bool) -> tuple[str, ...]:
    """The files the splits are derived from: (train, eval) or (data file,); refuses clashing paths."""
    paths = {f.path for f in files}
    for path in paths:
        clash = next((str(p) for p in PurePosixPath(path).parents if str(p) in paths), None)
        if clash is not None:
            raise StepInputError(f"source {source!r} has {clash!r} both as a file and as a folder of {path!r}")
    if single:
        return (files[0].path,)
    if TRAIN_FILE in paths and EVAL_FILE in paths:
        return (TRAIN_FILE, EVAL_FILE)
    if DATA_FILE in paths and TRAIN_FILE not in paths and EVAL_FILE not in paths:
        return (DATA_FILE,)
    missing = [name for name in (TRAIN_FILE, EVAL_FILE) if name not in paths]
    raise StepInputError(f"source {source!r} is missing {' and '.join(missing)}; {LAYOUT}")


def list_local(root: Path, source: str) -> list[SourceFile]:
    """Every regular file under `root` (or `root` itself), following symlinks only while they stay inside it."""
    if root.is_file():
        stat = root.stat()
        return [SourceFile(safe_relative(root.name, source), stat.st_size, str(root.resolve()), _mtime(stat))]
    if not root.is_dir():
        raise StepInputError(f"source {str(root)!r} does not exist or is not a file or folder; {LAYOUT}")
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
                stat = target.stat()
                files.append(SourceFile(str(rel), stat.st_size, str(target.resolve()), _mtime(stat)))
            else:
                raise StepInputError(f"{str(rel)!r} in {source!r} is not a regular file or folder; remove it")

    walk(real_root, PurePosixPath(), frozenset({real_root}))
    return files


def _mtime(stat: os.stat_result) -> str:
    return f"mtime:{stat.st_mtime_ns}"


def list_s3(client: Any, uri: str) -> tuple[list[SourceFile], bool]:
    """Every object under the prefix of `uri` (a folder: `s3://b/data` lists `data/...`, never `data2/...`).

    When nothing is under the folder but `uri` names an object, that object alone: (files, single=True).
    """
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
                etag = str(obj.get("ETag", "")).strip('"')
                files.append(SourceFile(safe_relative(relative, uri), int(obj["Size"]), obj["Key"], etag))
        if not files and prefix and not prefix.endswith("/"):
            try:
                head = client.head_object(Bucket=bucket, Key=prefix)
            except ClientError as err:
                if err.response.get("Error", {}).get("Code", "") not in ("404", "NoSuchKey", "NotFound"):
                    raise
            else:
                name = safe_relative(PurePosixPath(prefix).name, uri)
                etag = str(head.get("ETag", "")).strip('"')
                return [SourceFile(name, int(head["ContentLength"]), prefix, etag)], True
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
    return files, False


def _copy_stream(src: _Readable, target: Path) -> tuple[int, str]:
    """Write `src` to the new file `target` (fsynced) while hashing it; return its size and sha256."""
    digest = hashlib.sha256()
    size = 0
    with open(target, "xb") as out:
        while chunk := src.read(CHUNK_BYTES):
            digest.update(chunk)
            out.write(chunk)
            size += len(chunk)
        out.flush()
        os.fsync(out.fileno())
    return size, digest.hexdigest()


class Source:
    """Reads the listed files of one source into a folder: streamed and hashed, or in parts for large objects.

    With `fsx_linked_path`, an S3 source is listed as usual but its files are read from that FSx path.
    """

    def __init__(self, settings: StageSettings) -> None:
        self.uri = settings.source
        self.settings = settings
        self.client: Any = None
        self.bucket = ""
        self.transfer: Any = None  # boto3's TransferConfig, once a listing holds an object to fetch in parts
        self.linked: Path | None = None  # the resolved fsx_linked_path, once listed
        self.single = False
        if settings.fsx_linked_path and not is_s3(self.uri):
            raise StepInputError(
                f"fsx_linked_path (--fsx-linked-path) is {settings.fsx_linked_path!r} but source {self.uri!r} is "
                "not an s3:// URI: a data repository association links an S3 prefix; set source to that prefix, "
                "or fsx_linked_path to '' to stage the source as it is"
            )
        if is_s3(self.uri):
            # each file thread may run part_concurrency part downloads: size the pool for all of them
            self.client = s3_api_client(max_pool_connections=settings.concurrency * settings.part_concurrency)
            self.bucket, _ = split_s3(self.uri)

    def list(self) -> tuple[list[SourceFile], bool]:
        """The files to stage, and whether the source is a single file."""
        if self.client is None:
            root = local_path(self.uri)
            return list_local(root, self.uri), root.is_file()
        files, single = list_s3(self.client, self.uri)
        self.single = single
        if self.settings.fsx_linked_path:
            self.linked = self._linked_root(single)
            return files, single
        threshold = self.settings.multipart_threshold_mb << 20
        if any(f.size >= threshold for f in files):
            # imported only now (and before the copy threads): s3transfer adds 0.02 s to a start-up that a
            # dataset of small files does not need
            from boto3.s3.transfer import TransferConfig

            self.transfer = TransferConfig(
                multipart_threshold=threshold,
                multipart_chunksize=self.settings.multipart_chunk_mb << 20,
                max_concurrency=self.settings.part_concurrency,
            )
        return files, single

    def _linked_root(self, single: bool) -> Path:
        path = Path(self.settings.fsx_linked_path)
        fix = (
            f"set fsx_linked_path (--fsx-linked-path) to the FSx {'file' if single else 'directory'} where the "
            f"data repository association exposes {self.uri!r}, or to '' to download from S3"
        )
        if not path.is_absolute():
            raise StepInputError(f"fsx_linked_path {str(path)!r} is not an absolute path; {fix}")
        if single:
            return path  # the file itself: checked, like every linked file, as it is read
        try:
            root = path.resolve(strict=True)
        except (OSError, RuntimeError) as err:
            raise StepInputError(f"fsx_linked_path {str(path)!r} cannot be opened ({err}); {fix}") from err
        if not root.is_dir():
            raise StepInputError(f"fsx_linked_path {str(path)!r} is not a directory; {fix}")
        return root

    def _linked_file(self, linked: Path, file: SourceFile) -> Path:
        """Where `file` is under `linked`, checked to be a regular file of the listed size inside it."""
        candidate = linked if self.single else linked / file.path
        where = f"s3://{self.bucket}/{file.origin} at {str(candidate)!r}"
        lag = (
            "the data repository association has not imported it yet (auto-import lag, or an import policy "
            "without NEW/CHANGED events); rerun once it has, or stage without fsx_linked_path to download from S3"
        )
        try:
            resolved = candidate.resolve(strict=True)
            info = resolved.stat()
        except FileNotFoundError as err:
            if candidate.is_symlink():
                raise StepInputError(f"{where} is a broken symlink; remove it from the linked path") from err
            raise StepFailedError(f"{where} is missing: {lag}") from err
        except (OSError, RuntimeError) as err:
            raise StepInputError(f"{where} cannot be opened ({err})") from err
        if not self.single and not resolved.is_relative_to(linked):
            raise StepInputError(
                f"{where} leads outside fsx_linked_path {str(linked)!r}, to {str(resolved)!r}; "
                "refusing to stage it (replace the symlink with the file)"
            )
        if not S_ISREG(info.st_mode):
            raise StepFailedError(f"{where} is not a regular file: {lag}")
        if info.st_size != file.size:
            raise StepFailedError(f"{where} has {info.st_size} bytes, the S3 listing {file.size}: {lag}")
        return resolved

    def unchanged_since(self, file: SourceFile, copied: os.stat_result) -> bool:
        """Whether a copy of `file` written at `copied.st_mtime_ns` still holds what the source has.

        The ETag alone says so for a download. A linked file may have been copied before the DRA imported a
        same-size edit (the listing already had the new ETag); the import moves the file's ctime, so a linked file
        changed after its copy was written is read again.
        """
        if self.linked is None:
            return True
        try:
            linked = (self.linked if self.single else self.linked / file.path).stat()
        except OSError:
            return False  # read again: the copy step reports why
        return linked.st_ctime_ns < copied.st_mtime_ns

    def open(self, origin: str) -> _Readable:
        """A stream of one file's bytes."""
        if self.client is None:
            return open(origin, "rb")
        body: _Readable = self.client.get_object(Bucket=self.bucket, Key=origin)["Body"]
        return body

    def copy(self, file: SourceFile, into: Path) -> ManifestEntry:
        """Copy one file into `into` (fsynced), check its size against the listing, and record its sha256."""
        target = into / file.path
        target.parent.mkdir(parents=True, exist_ok=True)
        if self.linked is not None:
            # a copy, not a hard link: FSx may overwrite or drop a linked file's content when S3 changes
            # (docs.aws.amazon.com/fsx/latest/LustreGuide/hard-links.html), and a published version never changes
            with open(self._linked_file(self.linked, file), "rb") as src:
                size, sha256 = _copy_stream(src, target)
        elif self.transfer is not None and file.size >= self.transfer.multipart_threshold:
            from boto3.s3.transfer import S3Transfer

            # ranged GETs pinned to the object's ETag by s3transfer; hashing afterwards reads from the page cache
            with S3Transfer(self.client, self.transfer) as transfer:
                transfer.download_file(self.bucket, file.origin, str(target))
            size, sha256 = target.stat().st_size, sha256_file(target)
            fsync(target)
        else:
            with closing(self.open(file.origin)) as src:
                size, sha256 = _copy_stream(src, target)
        if size != file.size:
            raise StepFailedError(
                f"copied {size} bytes of {file.path!r} but the source listed {file.size}: it changed "
                "during staging; rerun once it is stable"
            )
        return ManifestEntry(file.path, size, sha256, file.etag)
