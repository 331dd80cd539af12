"""Copy a dataset (local folder or file, file://, s3:// prefix or object) into the shared FSx folder and fingerprint it.

    python -m steps.stage_data --source=s3://bucket/datasets/dates --dest-dir=/fsx/<workflow>/data

Layouts: a folder with train.jsonl and eval.jsonl, or one data file (a single .jsonl file or object, or a folder
holding data.jsonl) that is split into train/eval by a hash of each prompt, so a row's split never changes when
rows are added elsewhere. Records may be prompt/completion, instruction/input/output or chat `messages`; the
derived train.jsonl and eval.jsonl hold prompt/completion (steps.common.data). The source files themselves land
under raw/ (other files are copied too), listed in manifest.json with key, size, ETag and sha256.

Fast: files are copied `concurrency` at a time, S3 objects of at least `multipart_threshold_mb` in ranged parts
(`part_concurrency` per object). A file whose size and ETag (for a local file: its mtime) equal the previous
manifest's is not copied again: the published copy is hard-linked into the new version, so a re-stage with nothing
changed costs one listing.

Linked: when a data repository association (DRA) already exposes the s3:// source on FSx, --fsx-linked-path names
that FSx path (e.g. --source=s3://datasets/dates --fsx-linked-path=/fsx/dra/dates) and no object is downloaded. The
prefix is still listed (keys, sizes, ETags, the same key checks); each listed file must be under the linked path (no
symlink leading out of it), a regular file and of the listed size; it is then read there (FSx loads it from S3 on
first read) and copied, with its sha256, into the new version. A copy, not a hard link: FSx may overwrite or drop
the content of a linked file when its object changes, and a published version must never change. A missing file or
another size means the DRA has not imported the change yet (auto-import lag, or an import policy without NEW or
CHANGED events): the stage fails (exit 1, retried) naming the key. Only the size is compared: a same-size edit not
yet imported is staged with its old bytes; the next stage reads the file again, as it does any linked file changed
(ctime) after its published copy was written, so the import landing is enough to correct it.

Safe: the new version is built in a temporary sibling of dest_dir and published with a rename, so readers never see
a half-written dataset, a killed stage leaves the previous one intact, and a rerun completes (it removes what the
killed run left). Object keys with `..`, empty or absolute parts, and symlinks leading out of a local source are
refused: nothing is ever written outside dest_dir's parent.

Outputs (one file each under --outputs-dir):
    dataset_dir     the published folder (dest_dir)
    dataset_digest  "sha256:<hex>" over the sorted (path, sha256) pairs of every file: equal digests mean equal data
    changed         "true" unless --previous-digest equals the new digest (a cron retrains only when data changed)
    num_files       source files staged (manifest.json and the derived splits not counted)
    num_bytes       bytes of those files
    copied_files    files downloaded or copied this time (the rest were unchanged and linked); 0 with a linked path
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import closing
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from stat import S_ISREG
from typing import Any, BinaryIO, Protocol

from pydantic import BaseModel, Field

from eksflow.runtime.args import Settings, StepArgs, StepFailedError, StepInputError, run_step
from eksflow.runtime.outputs import Progress, atomic_write_text
from steps.common.data import EVAL_FILE, MANIFEST_FILE, TRAIN_FILE, normalize_record, split_of
from steps.common.storage import fsync, is_s3, local_path, s3_api_client, sha256_file, split_s3

CHUNK_BYTES = 1 << 20  # 1 MiB per read: large enough for S3 throughput, small enough for 64 threads
DATA_FILE = "data.jsonl"  # a folder's single data file, split into train and eval by stage_data
RAW_DIR = "raw"  # the source files inside the dataset folder
MANIFEST_VERSION = 2  # a manifest of another version is not reused: everything is copied again
LAYOUT = (
    f"expected <source>/{TRAIN_FILE} and <source>/{EVAL_FILE}, <source>/{DATA_FILE}, or a single .jsonl file or "
    "object (JSON lines of prompt/completion, instruction/input/output or chat messages)"
)


class StageSettings(Settings):
    """Where the dataset comes from and how it is copied (the `data` section of the pipeline config)."""

    source: str = Field("data/demo", description="dataset: local path, file:///path, s3://bucket/prefix or object")
    concurrency: int = Field(16, ge=1, le=64, description="files copied in parallel")
    part_concurrency: int = Field(8, ge=1, le=64, description="parts of one large S3 object downloaded in parallel")
    multipart_threshold_mb: int = Field(64, ge=5, description="S3 objects this large (MiB) are fetched in parts")
    multipart_chunk_mb: int = Field(16, ge=5, description="size of one part (MiB)")
    eval_fraction: float = Field(
        0.1, gt=0.0, lt=1.0, description="share of a single data file's rows (by prompt hash) that go to eval"
    )
    fsx_linked_path: str = Field(
        "",
        description="FSx path where a data repository association exposes the s3:// source (e.g. /fsx/dra/dates): "
        "files are read there, checked against the S3 listing, never downloaded; empty: download from S3",
    )


class Args(StageSettings, StepArgs):
    """Settings plus the destination the workflow chooses."""

    dest_dir: Path = Field(description="folder to publish the dataset in, e.g. /fsx/<workflow>/data")
    previous_digest: str = Field("", description="digest of the last trained dataset; sets the `changed` output")


class Outputs(BaseModel):
    """Argo output parameters of stage_data."""

    dataset_dir: str
    dataset_digest: str
    changed: bool
    num_files: int
    num_bytes: int
    copied_files: int


@dataclass(frozen=True)
class SourceFile:
    """One file to copy: its path relative to the source, its listed size and version, and where to read it."""

    path: str  # POSIX, relative, already checked to stay inside the destination
    size: int
    origin: str  # absolute local path, or the S3 object key
    etag: str = ""  # the S3 ETag; for a local file "mtime:<ns>"


@dataclass(frozen=True)
class ManifestEntry:
    """One staged file as manifest.json records it."""

    path: str
    size: int
    sha256: str
    etag: str = ""


class _Readable(Protocol):
    def read(self, amt: int = ..., /) -> bytes: ...

    def close(self) -> None: ...


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


def previous_manifest(dest: Path, source: str) -> dict[str, Any]:
    """The manifest of the published version at `dest` if it may be reused (same source and version), else {}."""
    try:
        manifest = json.loads((dest / MANIFEST_FILE).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(manifest, dict) or (manifest.get("version"), manifest.get("source")) != (
        MANIFEST_VERSION,
        source,
    ):
        return {}
    return manifest


def previous_entries(manifest: dict[str, Any]) -> dict[str, ManifestEntry]:
    """The source files a previous manifest lists, by path."""
    entries = {}
    for item in manifest.get("files", []):
        entry = ManifestEntry(str(item["key"]), int(item["size"]), str(item["sha256"]), str(item.get("etag", "")))
        entries[entry.path] = entry
    return entries


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
            for future in as_completed([pool.submit(source.copy, f, into) for f in todo]):
                entry = future.result()
                entries.append(entry)
                progress.advance(note=entry.path)
    finally:
        # waits for the copies in flight, so the caller may delete `into` afterwards
        pool.shutdown(wait=True, cancel_futures=True)
    return sorted(entries, key=lambda e: e.path), len(todo)


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
    fsync(dest.parent)  # the rename itself must survive a crash before the old copy goes
    if aside is not None:
        _remove(aside)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


def _remove_leftovers(dest: Path) -> None:
    """Delete the temporary siblings a killed earlier run left; put back a published copy it had moved aside."""
    asides = sorted(dest.parent.glob(f".{dest.name}.old-*"), key=lambda p: p.stat().st_mtime_ns)
    if asides and not (dest.exists() or dest.is_symlink()):
        # killed between the two renames of publish: the newest aside is the last published version
        os.replace(asides.pop(), dest)
    for leftover in [*dest.parent.glob(f".{dest.name}.tmp-*"), *asides]:
        _remove(leftover)


@dataclass(frozen=True)
class Staged:
    """What one stage published."""

    files: list[ManifestEntry]  # source files, by path below raw/
    derived: list[ManifestEntry]  # train.jsonl and eval.jsonl
    digest: str
    copied: int  # downloaded or copied from the source
    verified: int  # read from fsx_linked_path after checking it against the S3 listing


def stage(settings: StageSettings, dest: Path) -> Staged:
    """List, check, copy (or reuse) and publish `settings.source` at `dest` with its manifest.json."""
    source = Source(settings)
    files, single = source.list()
    if any(f.path == MANIFEST_FILE for f in files):
        print(f"note: ignoring {MANIFEST_FILE} in {settings.source!r}: staging writes its own", file=sys.stderr)
        files = [f for f in files if f.path != MANIFEST_FILE]
    inputs = check_layout(files, settings.source, single=single)

    dest.parent.mkdir(parents=True, exist_ok=True)
    _remove_leftovers(dest)
    manifest = previous_manifest(dest, settings.source)
    staged = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
    staged.chmod(0o755)  # mkdtemp makes it private; the train and evaluate pods may run as other users
    try:
        entries, read = copy_all(
            files, source, staged / RAW_DIR, settings.concurrency, previous_entries(manifest), dest / RAW_DIR
        )
        # what the derived splits depend on: reused when it is the same as last time
        shas = {e.path: e.sha256 for e in entries}
        split = {
            "inputs": {name: shas[name] for name in inputs},
            "eval_fraction": settings.eval_fraction if len(inputs) == 1 else None,
        }
        derived = reuse_derived(manifest, split, dest, staged) or derive(
            staged / RAW_DIR, inputs, staged, settings.eval_fraction
        )
        digest = manifest_digest([*(replace(e, path=f"{RAW_DIR}/{e.path}") for e in entries), *derived])
        manifest = {
            "version": MANIFEST_VERSION,
            "source": settings.source,
            "files": [{"key": e.path, "size": e.size, "etag": e.etag, "sha256": e.sha256} for e in entries],
            "derived": [{"path": e.path, "size": e.size, "sha256": e.sha256} for e in derived],
            "split": split,
            "digest": digest,
        }
        atomic_write_text(staged / MANIFEST_FILE, json.dumps(manifest, indent=1) + "\n")
        publish(staged, dest)
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise
    linked = source.linked is not None
    return Staged(entries, derived, digest, copied=0 if linked else read, verified=read if linked else 0)


def run(args: Args) -> Outputs:
    """Stage `args.source` into `args.dest_dir`."""
    dest = args.dest_dir.absolute()
    started = time.monotonic()
    staged = stage(args, dest)
    num_bytes = sum(e.size for e in staged.files)
    changed = staged.digest != args.previous_digest
    read = (
        f"{staged.verified} verified in place at {args.fsx_linked_path} (no S3 download), "
        if args.fsx_linked_path
        else f"{staged.copied} copied, "
    )
    print(
        f"staged {len(staged.files)} files, {num_bytes} bytes ({read}"
        f"{len(staged.files) - staged.copied - staged.verified} unchanged) from {args.source} to {dest} in "
        f"{time.monotonic() - started:.1f} s ({staged.digest}{'' if changed else ', unchanged since last time'})",
        file=sys.stderr,
    )
    return Outputs(
        dataset_dir=str(dest),
        dataset_digest=staged.digest,
        changed=changed,
        num_files=len(staged.files),
        num_bytes=num_bytes,
        copied_files=staged.copied,
    )


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m steps.stage_data`."""
    return run_step(Args, run, argv)


if __name__ == "__main__":
    # a one-shot process keeps what start-up loaded (pydantic, botocore: ~75,000 objects) until it exits; frozen,
    # the cyclic GC stops walking them at every full collection and at exit, which cost 0.1 s of a 1 s stage
    gc.freeze()
    status = main()
    gc.freeze()
    raise SystemExit(status)
