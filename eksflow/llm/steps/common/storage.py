"""Storage locations: s3://bucket/prefix, file:///path and plain local paths (FSx is a local mount).

boto3 honours AWS_ENDPOINT_URL, AWS_PROFILE and AWS_REGION, so the same code talks to AWS S3 in the cluster
and to a local S3 server (moto_server) in tests.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from eksflow.errors import EXIT_BAD_INPUT
from eksflow.llm.steps.common.s3errors import s3_errors
from eksflow.runtime.args import StepInputError


class UnsafeKeyError(StepInputError):
    """An object key that would land outside the folder it is copied into."""

    label = "unsafe key"
    exit_code = EXIT_BAD_INPUT


S3_BUCKET = re.compile(r"[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]")  # AWS's bucket naming rules (lower case, 3-63)
ACCEPTED = "a dataset folder, file:///absolute/path or s3://bucket/prefix"


def location_problem(uri: str, accepted: str = ACCEPTED) -> str | None:
    """Why `uri` is not a location a step can read (checked before anything runs: no I/O), or None.

    `accepted` says what the setting takes (a dataset's forms by default; a base model's: its demo name too).
    """
    if not uri.strip():
        return f"is empty; give {accepted}"
    if uri != uri.strip():
        return "has spaces around it; remove them"
    parsed = urlparse(uri)
    if uri.startswith("s3://"):
        if not S3_BUCKET.fullmatch(parsed.netloc) or ".." in parsed.netloc:
            rule = "3-63 lower-case letters, digits, '.' and '-'"
            return f"names no valid bucket ({parsed.netloc!r}: {rule}); give {accepted}"
        if parsed.query or parsed.fragment or "?" in uri or "#" in uri:
            return "holds a query or fragment; give s3://bucket/prefix"
        parts = parsed.path.lstrip("/").split("/")
        if any(part in (".", "..") for part in parts) or "" in parts[:-1]:
            return "has '.', '..' or empty parts in its key; give the object's or prefix's own key"
        return None
    if uri.startswith("file://"):
        if parsed.netloc not in ("", "localhost") or not parsed.path.startswith("/"):
            return "is not file:///absolute/path (a file URI has three slashes and an absolute path)"
        return None
    if "://" in uri:
        return f"has a scheme eksflow does not read; give {accepted}"
    return None


def is_s3(uri: str) -> bool:
    """True for s3://bucket[/prefix]."""
    return uri.startswith("s3://")


def split_s3(uri: str) -> tuple[str, str]:
    """`s3://bucket/a/b` -> (`bucket`, `a/b`)."""
    parsed = urlparse(uri)
    if parsed.scheme != "s3" or not parsed.netloc:
        raise StepInputError(f"{uri!r} is not an S3 URI; expected s3://bucket/prefix")
    return parsed.netloc, parsed.path.lstrip("/")


def local_path(uri: str) -> Path:
    """A file:// URI or plain path as a Path; other schemes are refused with the accepted forms."""
    if uri.startswith("file://"):
        return Path(unquote(urlparse(uri).path))
    if "://" in uri:
        raise StepInputError(f"unsupported location {uri!r}; use s3://bucket/prefix, file:///path or a local path")
    return Path(uri)


def s3_client(max_pool_connections: int = 32) -> Any:
    """A boto3 S3 client configured from the environment (endpoint, profile, region, retries).

    `max_pool_connections` bounds the HTTP connections kept open: at least the number of parallel requests.
    It has boto3's `upload_file` and `download_file`; a step that needs neither can take `s3_api_client`.
    """
    import boto3

    return boto3.session.Session().client("s3", config=_client_config(max_pool_connections))


def s3_api_client(max_pool_connections: int = 32) -> Any:
    """A botocore S3 client configured like `s3_client`, without boto3's transfer methods and with raw timestamps.

    Creating it skips boto3's session and the s3transfer import its transfer methods need: 0.03-0.06 s less
    start-up for a short step. Timestamps (`LastModified`) stay the strings S3 sent, as the AWS CLI keeps them
    (botocore's credential providers accept both): parsing them is a tenth of the client time of a small GET.
    """
    import botocore.session

    session = botocore.session.get_session()
    session.get_component("response_parser_factory").set_parser_defaults(timestamp_parser=str)
    return session.create_client("s3", config=_client_config(max_pool_connections))


def _client_config(max_pool_connections: int) -> Any:
    from botocore.config import Config

    # An explicit retries setting hides $AWS_MAX_ATTEMPTS from botocore, so it is read here. A 10 s connect
    # timeout (botocore's is 60 s, per attempt) lets a blackholed endpoint fail in a minute, not five.
    attempts = os.environ.get("AWS_MAX_ATTEMPTS", "")
    return Config(
        retries={"max_attempts": int(attempts) if attempts.isdigit() and int(attempts) > 0 else 5, "mode": "standard"},
        connect_timeout=10,
        max_pool_connections=max_pool_connections,
    )


def download_prefix(uri: str, dest: Path, *, skip: frozenset[str] = frozenset(), client: Any = None) -> list[str]:
    """Copy every object under an s3:// prefix into `dest`, keeping relative keys; return the keys copied.

    Relative keys in `skip` are left out; a key that would land outside `dest` raises UnsafeKeyError. An S3
    failure is one StepInputError or StepFailedError line (eksflow.llm.steps.common.s3errors).
    """
    bucket, prefix = split_s3(uri)
    base = prefix.rstrip("/") + "/" if prefix else ""
    copied = []
    with s3_errors("downloading", uri):
        client = client or s3_client()
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=base):
            for obj in page.get("Contents", []):
                relative = obj["Key"][len(base) :]
                if not relative or relative.endswith("/") or relative in skip:
                    continue
                target = (dest / relative).resolve()
                if not target.is_relative_to(dest.resolve()):
                    raise UnsafeKeyError(f"object key {obj['Key']!r} escapes the destination; refusing to copy it")
                target.parent.mkdir(parents=True, exist_ok=True)
                client.download_file(bucket, obj["Key"], str(target))
                copied.append(relative)
    return copied


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fsync(path: Path) -> None:
    """Flush a file's (or a directory's entries') writes to stable storage."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    """`fsync` a directory, so a rename in it survives a crash; a no-op where the file system cannot."""
    with contextlib.suppress(OSError):
        fsync(path)


@contextlib.contextmanager
def exclusive(path: Path) -> Iterator[None]:
    """An exclusive flock on `path`, created if missing (released when the holder exits, even by SIGKILL).

    FSx for Lustre honours flock across nodes when mounted with `-o flock` (AWS's documented mount options). Where
    a file system ignores it, holders run at once: each of its users also publishes by renaming a temporary
    folder, so what it guards stays whole either way.
    """
    with open(path, "a+b") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
