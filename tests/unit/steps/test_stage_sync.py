"""Incremental and multipart staging from a real S3 API (moto_server), and what a killed stage leaves behind."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

import eksflow.llm.steps.stage_data.sources
from eksflow.llm.steps.common.storage import s3_client
from eksflow.llm.steps.stage_data import Args, Outputs
from eksflow.llm.steps.stage_data.step import run

ROW = b'{"prompt": "Date: May 1, 2020", "completion": "2020-05-01"}\n'
KILL_TIMEOUT_S = 60.0


def make_bucket(objects: dict[str, bytes]) -> str:
    bucket = f"eksflow-{uuid.uuid4().hex[:12]}"
    client = s3_client()
    client.create_bucket(Bucket=bucket)
    put(bucket, objects)
    return bucket


def put(bucket: str, objects: dict[str, bytes]) -> None:
    client = s3_client()
    for key, body in objects.items():
        client.put_object(Bucket=bucket, Key=key, Body=body)


def dataset(shards: int, version: bytes = b"") -> dict[str, bytes]:
    objects = {"data/train.jsonl": ROW * 3, "data/eval.jsonl": ROW}
    objects.update({f"data/shards/{i:03d}.bin": version + f"shard {i}\n".encode() for i in range(shards)})
    return objects


def stage(uri: str, dest: Path, **settings: Any) -> Outputs:
    return run(Args(source=uri, dest_dir=dest, **settings))


def inodes(root: Path) -> dict[str, int]:
    return {p.relative_to(root).as_posix(): p.stat().st_ino for p in (root / "raw").rglob("*") if p.is_file()}


def verify(dest: Path) -> dict[str, Any]:
    """The published manifest, after checking every file it lists against its sha256."""
    manifest: dict[str, Any] = json.loads((dest / "manifest.json").read_text())
    for entry in manifest["files"]:
        assert hashlib.sha256((dest / "raw" / entry["key"]).read_bytes()).hexdigest() == entry["sha256"]
    for entry in manifest["derived"]:
        assert hashlib.sha256((dest / entry["path"]).read_bytes()).hexdigest() == entry["sha256"]
    return manifest


def test_unchanged_restage_copies_nothing_and_reports_unchanged(s3_env, tmp_path):
    bucket = make_bucket(dataset(20))
    dest = tmp_path / "fsx" / "data"
    first = stage(f"s3://{bucket}/data", dest)
    before = inodes(dest)

    again = stage(f"s3://{bucket}/data", dest, previous_digest=first.dataset_digest)

    assert (first.copied_files, again.copied_files) == (22, 0)
    assert again.dataset_digest == first.dataset_digest and again.changed is False and first.changed is True
    assert inodes(dest) == before  # the published files were linked into the new version, not rewritten
    verify(dest)
    assert sorted(p.name for p in dest.parent.iterdir()) == ["data"]


def test_changed_object_alone_is_copied(s3_env, tmp_path):
    bucket = make_bucket(dataset(20))
    dest = tmp_path / "fsx" / "data"
    first = stage(f"s3://{bucket}/data", dest)
    put(bucket, {"data/shards/007.bin": b"shard 7, edited\n", "data/shards/new.bin": b"added\n"})
    s3_client().delete_object(Bucket=bucket, Key="data/shards/003.bin")

    second = stage(f"s3://{bucket}/data", dest, previous_digest=first.dataset_digest)

    assert second.copied_files == 2 and second.num_files == 22 and second.changed is True
    assert (dest / "raw/shards/007.bin").read_bytes() == b"shard 7, edited\n"
    assert not (dest / "raw/shards/003.bin").exists()
    manifest = verify(dest)
    assert manifest["digest"] == second.dataset_digest != first.dataset_digest


def test_same_size_edit_is_seen_by_etag(s3_env, tmp_path):
    bucket = make_bucket(dataset(2))
    dest = tmp_path / "fsx" / "data"
    stage(f"s3://{bucket}/data", dest)
    put(bucket, {"data/shards/001.bin": b"shard X\n"})  # same size, other bytes
    assert stage(f"s3://{bucket}/data", dest).copied_files == 1
    assert (dest / "raw/shards/001.bin").read_bytes() == b"shard X\n"


def test_large_objects_are_fetched_in_parts(s3_env, tmp_path, monkeypatch):
    big = os.urandom(11 << 20)
    bucket = make_bucket({**dataset(3), "data/big.bin": big})
    ranges: list[str] = []
    make_client = eksflow.llm.steps.stage_data.sources.s3_api_client

    def spying_client(**kwargs: Any) -> Any:
        client = make_client(**kwargs)
        client.meta.events.register(
            "provide-client-params.s3.GetObject", lambda params, **_: ranges.append(params.get("Range", "whole"))
        )
        return client

    monkeypatch.setattr(eksflow.llm.steps.stage_data.sources, "s3_api_client", spying_client)
    dest = tmp_path / "fsx" / "data"
    stage(f"s3://{bucket}/data", dest, multipart_threshold_mb=5, multipart_chunk_mb=5, part_concurrency=3)

    assert (dest / "raw/big.bin").read_bytes() == big
    assert sorted(r for r in ranges if r.startswith("bytes=")) == [
        "bytes=0-5242879",
        "bytes=10485760-",  # s3transfer leaves the last range open
        "bytes=5242880-10485759",
    ]
    assert ranges.count("whole") == 5  # the small objects: one GET each
    entry = next(f for f in verify(dest)["files"] if f["key"] == "big.bin")
    assert entry["sha256"] == hashlib.sha256(big).hexdigest()


def test_small_objects_are_staged_without_loading_boto3s_transfer_layer(s3_env, tmp_path):
    """Only objects fetched in parts need s3transfer: a dataset of small files does not pay for importing it."""
    bucket = make_bucket(dataset(3))
    stage_then_list_loaded = (
        "import sys; from eksflow.llm.steps.stage_data.step import main; main(sys.argv[1:]); "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'boto3', 's3transfer'}))"
    )
    argv = [f"--source=s3://{bucket}/data", f"--dest-dir={tmp_path / 'data'}", f"--outputs-dir={tmp_path / 'out'}"]
    staged = subprocess.run(
        [sys.executable, "-c", stage_then_list_loaded, *argv],
        cwd=Path(__file__).resolve().parents[3],
        capture_output=True,
        text=True,
        check=True,
    )
    assert staged.stdout.strip() == "[]"
    verify(tmp_path / "data")


def test_single_object_source_is_split(s3_env, tmp_path):
    rows = b"".join(json.dumps({"prompt": f"q{i}", "completion": f"a{i}"}).encode() + b"\n" for i in range(200))
    bucket = make_bucket({"exports/data.jsonl": rows})
    dest = tmp_path / "fsx" / "data"
    out = stage(f"s3://{bucket}/exports/data.jsonl", dest, eval_fraction=0.2)

    train = (dest / "train.jsonl").read_bytes().splitlines()
    held_out = (dest / "eval.jsonl").read_bytes().splitlines()
    assert sorted(train + held_out) == sorted(rows.splitlines()) and 20 <= len(held_out) <= 60
    assert out.num_files == 1 and (dest / "raw/data.jsonl").read_bytes() == rows


def test_publish_killed_between_renames_is_recovered(s3_env, tmp_path):
    bucket = make_bucket(dataset(5))
    dest = tmp_path / "fsx" / "data"
    first = stage(f"s3://{bucket}/data", dest)
    os.replace(dest, dest.with_name(".data.old-0123456789ab"))  # what publish's first rename leaves

    again = stage(f"s3://{bucket}/data", dest)

    assert again.copied_files == 0 and again.dataset_digest == first.dataset_digest
    assert sorted(p.name for p in dest.parent.iterdir()) == ["data"]


@pytest.mark.slow
def test_killed_stage_keeps_the_previous_dataset_and_a_rerun_completes(s3_env, tmp_path):
    bucket = make_bucket(dataset(150))
    fsx = tmp_path / "fsx"
    dest = fsx / "data"
    first = stage(f"s3://{bucket}/data", dest)
    published = verify(dest)
    put(bucket, dataset(150, version=b"v2 "))  # every shard changes: the next stage copies them all
    outside_before = sorted(p for p in tmp_path.rglob("*") if fsx not in p.parents and p != fsx)

    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "eksflow.llm.steps.stage_data",
            f"--source=s3://{bucket}/data",
            f"--dest-dir={dest}",
            f"--outputs-dir={tmp_path / 'out'}",
            "--concurrency=1",
        ],
        env=os.environ.copy(),
        cwd=Path(__file__).resolve().parents[3],
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + KILL_TIMEOUT_S
    try:
        while len(list(fsx.glob(".data.tmp-*/raw/shards/*"))) < 10:
            assert proc.poll() is None, "the stage finished before it could be killed mid-copy"
            assert time.monotonic() < deadline, "the stage copied nothing in time"
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()

    assert verify(dest) == published  # the previous version, whole
    assert list(fsx.glob(".data.tmp-*")), "the kill should have left the temporary folder"
    assert sorted(p for p in tmp_path.rglob("*") if fsx not in p.parents and p != fsx) == outside_before

    rerun = stage(f"s3://{bucket}/data", dest, previous_digest=first.dataset_digest)

    assert rerun.changed is True and rerun.copied_files == 150
    assert (dest / "raw/shards/042.bin").read_bytes() == b"v2 shard 42\n"
    verify(dest)
    assert sorted(p.name for p in fsx.iterdir()) == ["data"]
