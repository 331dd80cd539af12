"""Staging an S3 prefix that a data repository association already exposes on FSx: checked there, never downloaded.

A local folder mirroring the bucket's objects stands for the linked FSx path; the bucket is a real S3 API
(moto_server), and a botocore hook records every request the step's client makes.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

import eksflow.llm.steps.stage_data.sources
from eksflow.llm.steps.common.storage import s3_client
from eksflow.llm.steps.stage_data import Args, Outputs
from eksflow.llm.steps.stage_data.step import main, run

ROW = b'{"prompt": "Date: May 1, 2020", "completion": "2020-05-01"}\n'
OBJECTS = {"data/train.jsonl": ROW * 3, "data/eval.jsonl": ROW, "data/shards/a.bin": b"shard a\n"}
TICK_S = 0.05  # file timestamps advance in kernel ticks (up to 10 ms): what happens later must be a tick later


def make_bucket(objects: dict[str, bytes]) -> str:
    bucket = f"eksflow-{uuid.uuid4().hex[:12]}"
    s3_client().create_bucket(Bucket=bucket)
    put(bucket, objects)
    return bucket


def put(bucket: str, objects: dict[str, bytes]) -> None:
    for key, body in objects.items():
        s3_client().put_object(Bucket=bucket, Key=key, Body=body)


def mirror(root: Path, objects: dict[str, bytes], prefix: str = "data/") -> Path:
    """What the DRA shows on FSx: each object under `prefix` as a file under `root`."""
    for key, body in objects.items():
        (root / key.removeprefix(prefix)).parent.mkdir(parents=True, exist_ok=True)
        (root / key.removeprefix(prefix)).write_bytes(body)
    time.sleep(TICK_S)  # imported before the stage starts, as on FSx
    return root


def record_requests(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the S3 operations the step's clients call from now on."""
    operations: list[str] = []
    make_client = eksflow.llm.steps.stage_data.sources.s3_api_client

    def recording_client(**kwargs: Any) -> Any:
        client = make_client(**kwargs)
        client.meta.events.register("before-call.s3", lambda model, **_: operations.append(model.name))
        return client

    monkeypatch.setattr(eksflow.llm.steps.stage_data.sources, "s3_api_client", recording_client)
    return operations


def stage(uri: str, dest: Path, linked: Path | str = "") -> Outputs:
    return run(Args(source=uri, dest_dir=dest, fsx_linked_path=str(linked)))


def files_under(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*")} if root.exists() else set()


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_linked_stage_equals_a_download_without_fetching_an_object(s3_env, tmp_path, monkeypatch):
    bucket = make_bucket(OBJECTS)
    downloaded = stage(f"s3://{bucket}/data", tmp_path / "s3" / "data")
    linked = mirror(tmp_path / "dra", OBJECTS)
    requests = record_requests(monkeypatch)

    dest = tmp_path / "fsx" / "data"
    out = stage(f"s3://{bucket}/data", dest, linked)

    assert requests == ["ListObjectsV2"]
    assert out.dataset_digest == downloaded.dataset_digest and (out.num_files, out.copied_files) == (3, 0)
    # keys, sizes, ETags from the listing and sha256s: the same manifest as the download's
    assert (dest / "manifest.json").read_text() == (tmp_path / "s3" / "data" / "manifest.json").read_text()
    (linked / "shards/a.bin").write_bytes(b"shard A\n")  # FSx rewriting the linked file in place
    assert (dest / "raw/shards/a.bin").read_bytes() == b"shard a\n"  # a copy: the published version is unchanged


def test_a_same_size_edit_not_imported_yet_is_read_again_once_it_lands(s3_env, tmp_path):
    bucket = make_bucket(OBJECTS)
    linked = mirror(tmp_path / "dra", OBJECTS)
    put(bucket, {"data/shards/a.bin": b"shard B\n"})  # same size; the DRA still shows "shard a"
    dest = tmp_path / "fsx" / "data"
    staged = dest / "raw/shards/a.bin"

    stage(f"s3://{bucket}/data", dest, linked)
    entry = next(f for f in json.loads((dest / "manifest.json").read_text())["files"] if f["key"] == "shards/a.bin")
    assert entry["sha256"] == sha256(b"shard a\n")  # the linked bytes: S3's were never read
    copy_inode = staged.stat().st_ino
    stage(f"s3://{bucket}/data", dest, linked)
    assert staged.stat().st_ino == copy_inode  # nothing changed on FSx: the published copy is reused

    time.sleep(TICK_S)
    (linked / "shards/a.bin").write_bytes(b"shard B\n")  # the import lands
    out = stage(f"s3://{bucket}/data", dest, linked)

    assert staged.read_bytes() == b"shard B\n" and staged.stat().st_ino != copy_inode
    assert out.dataset_digest == stage(f"s3://{bucket}/data", tmp_path / "s3" / "data").dataset_digest


def test_single_object_source_is_read_from_its_linked_file(s3_env, tmp_path, monkeypatch):
    rows = b"".join(json.dumps({"prompt": f"q{i}", "completion": f"a{i}"}).encode() + b"\n" for i in range(50))
    bucket = make_bucket({"exports/data.jsonl": rows})
    linked = mirror(tmp_path / "dra", {"data.jsonl": rows}, prefix="") / "data.jsonl"
    requests = record_requests(monkeypatch)

    out = stage(f"s3://{bucket}/exports/data.jsonl", tmp_path / "fsx" / "data", linked)

    assert "GetObject" not in requests and out.num_files == 1
    assert (tmp_path / "fsx" / "data" / "raw/data.jsonl").read_bytes() == rows


@pytest.mark.parametrize(
    ("case", "code", "message"),
    [
        ("missing", 1, r"data/shards/a\.bin at .* is missing: the data repository association has not imported"),
        ("other-size", 1, r"data/shards/a\.bin at .* has 16 bytes, the S3 listing 8: .*not imported it yet"),
        ("symlink-out", 2, r"data/shards/a\.bin at .* leads outside fsx_linked_path"),
        ("no-linked-dir", 2, r"fsx_linked_path '.*nowhere' cannot be opened"),
        ("local-source", 2, r"fsx_linked_path \(--fsx-linked-path\) is '.*' but source '.*' is not an s3:// URI"),
    ],
)
def test_a_linked_path_that_does_not_match_the_listing_fails_and_publishes_nothing(
    s3_env, tmp_path, capsys, case, code, message
):
    bucket = make_bucket(OBJECTS)
    linked = mirror(tmp_path / "dra", {k: v for k, v in OBJECTS.items() if k != "data/shards/a.bin"})
    source = f"s3://{bucket}/data"
    (linked / "shards").mkdir(exist_ok=True)
    if case == "other-size":
        (linked / "shards/a.bin").write_bytes(b"shard a, longer\n")
    elif case == "symlink-out":
        (tmp_path / "outside.bin").write_bytes(b"shard a\n")
        (linked / "shards/a.bin").symlink_to(tmp_path / "outside.bin")
    elif case == "no-linked-dir":
        linked = tmp_path / "nowhere"
    elif case == "local-source":
        source = str(mirror(tmp_path / "local", OBJECTS))
    argv = [f"--source={source}", f"--fsx-linked-path={linked}", f"--dest-dir={tmp_path / 'fsx' / 'data'}"]

    assert main([*argv, f"--outputs-dir={tmp_path / 'out'}"]) == code

    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and re.search(message, errors[0]), errors
    assert files_under(tmp_path / "fsx") == set() and not (tmp_path / "out").exists()
