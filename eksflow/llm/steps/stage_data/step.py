"""The stage step: build the new version in a temporary sibling, publish it with a rename, write the outputs."""

from __future__ import annotations

import gc
import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, replace
from pathlib import Path

from eksflow.llm.steps.common.data import MANIFEST_FILE
from eksflow.llm.steps.common.s3errors import s3_errors
from eksflow.llm.steps.common.storage import fsync
from eksflow.llm.steps.stage_data import Args, Outputs, StageSettings
from eksflow.llm.steps.stage_data.derive import derive
from eksflow.llm.steps.stage_data.manifest import (
    MANIFEST_VERSION,
    RAW_DIR,
    ManifestEntry,
    manifest_digest,
    previous_entries,
    previous_manifest,
)
from eksflow.llm.steps.stage_data.sources import Source, check_layout
from eksflow.llm.steps.stage_data.sync import copy_all, reuse_derived
from eksflow.runtime.args import run_step
from eksflow.runtime.outputs import atomic_write_text


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


def change_reason(digest: str, previous_digest: str, previous_version: str) -> str:
    """Whether the data changed, in words naming what it was compared with (what a skipped train's page says)."""
    if not previous_digest:
        return "no earlier training data to compare with"
    since = f"champion v{previous_version}" if previous_version else "the last training data"
    short = digest.removeprefix("sha256:")[:12]
    return (
        f"data unchanged since {since} (sha256:{short})" if digest == previous_digest else f"data changed since {since}"
    )


def run(args: Args) -> Outputs:
    """Stage `args.source` into `args.dest_dir`."""
    dest = args.dest_dir.absolute()
    started = time.monotonic()
    with s3_errors("staging", args.source):  # an S3 failure in listing or copying: one line, not three tracebacks
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
        data_key=staged.digest.removeprefix("sha256:"),
        changed=changed,
        reason=change_reason(staged.digest, args.previous_digest, args.previous_version),
        num_files=len(staged.files),
        num_bytes=num_bytes,
        copied_files=staged.copied,
    )


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m eksflow.llm.steps.stage_data`."""
    return run_step(Args, run, argv)


if __name__ == "__main__":
    # a one-shot process keeps what start-up loaded (pydantic, botocore: ~75,000 objects) until it exits; frozen,
    # the cyclic GC stops walking them at every full collection and at exit, which cost 0.1 s of a 1 s stage
    gc.freeze()
    status = main()
    gc.freeze()
    raise SystemExit(status)
