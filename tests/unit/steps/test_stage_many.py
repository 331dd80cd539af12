"""Staging at scale: thousands of objects under one prefix (several listing pages) from a real S3 API (moto_server),
bounded concurrency, and a re-stage that copies only what changed; and a large single file split as a stream."""

from __future__ import annotations

import json
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from eksflow.llm.steps.common.storage import s3_client
from eksflow.llm.steps.stage_data import Args
from eksflow.llm.steps.stage_data.sources import Source
from eksflow.llm.steps.stage_data.step import run
from eksflow.llm.steps.stage_data.sync import completed

ROW = b'{"prompt": "Date: May 1, 2020", "completion": "2020-05-01"}\n'
OBJECTS = 2500  # 3 pages of S3's 1,000-key listings


def test_completed_keeps_at_most_window_tasks_submitted_and_unread():
    pulled, finished, worst = [0], [0], [0]

    def items():
        for i in range(200):
            pulled[0] += 1
            worst[0] = max(worst[0], pulled[0] - finished[0])
            yield i

    def task(i: int) -> int:
        time.sleep(0.001)
        return i * i

    results = []
    with ThreadPoolExecutor(max_workers=4) as pool:
        for value in completed(pool, task, items(), window=8):
            finished[0] += 1
            results.append(value)
    assert sorted(results) == [i * i for i in range(200)]
    assert worst[0] <= 8 + 1  # the item being submitted, plus at most `window` unread


@pytest.mark.slow
def test_thousands_of_objects_are_listed_copied_with_bounded_concurrency_and_skipped_when_unchanged(
    s3_env, tmp_path, monkeypatch
):
    bucket = f"eksflow-{uuid.uuid4().hex[:12]}"
    client = s3_client(max_pool_connections=16)
    client.create_bucket(Bucket=bucket)
    objects = {f"data/shards/{i // 100:02d}/{i:05d}.bin": f"shard {i}\n".encode() for i in range(OBJECTS)}
    objects.update({"data/train.jsonl": ROW * 3, "data/eval.jsonl": ROW})
    with ThreadPoolExecutor(max_workers=16) as pool:
        list(pool.map(lambda item: client.put_object(Bucket=bucket, Key=item[0], Body=item[1]), objects.items()))

    in_flight, worst, lock = [0], [0], threading.Lock()
    copy = Source.copy

    def counted(self, file, into):
        with lock:
            in_flight[0] += 1
            worst[0] = max(worst[0], in_flight[0])
        try:
            return copy(self, file, into)
        finally:
            with lock:
                in_flight[0] -= 1

    monkeypatch.setattr(Source, "copy", counted)
    dest = tmp_path / "data"
    first = run(Args(source=f"s3://{bucket}/data", dest_dir=dest, concurrency=8))
    assert (first.num_files, first.copied_files) == (len(objects), len(objects))
    assert 1 < worst[0] <= 8
    manifest = json.loads((dest / "manifest.json").read_text())
    assert sorted(f["key"] for f in manifest["files"]) == sorted(k.removeprefix("data/") for k in objects)
    assert (dest / "raw" / "shards" / "24" / "02499.bin").read_bytes() == b"shard 2499\n"

    again = run(Args(source=f"s3://{bucket}/data", dest_dir=dest, concurrency=8))
    assert (again.copied_files, again.dataset_digest) == (0, first.dataset_digest)
    client.put_object(Bucket=bucket, Key="data/shards/07/00777.bin", Body=b"changed\n")
    changed = run(Args(source=f"s3://{bucket}/data", dest_dir=dest, concurrency=8))
    assert changed.copied_files == 1 and changed.dataset_digest != first.dataset_digest


def test_a_single_data_file_is_split_line_by_line(tmp_path):
    """The split of a single file is the per-line hash rule, written as it streams (its hashes checked here)."""
    import hashlib

    from eksflow.llm.steps.common.data import split_of

    source = tmp_path / "src" / "data.jsonl"
    source.parent.mkdir()
    rows = [{"instruction": f"Say {i}", "output": str(i)} for i in range(3000)]
    lines = [json.dumps(r) + "\n" for r in rows] + ["{broken\n", "\n"]
    source.write_text("".join(lines), encoding="utf-8")
    out = run(Args(source=str(source), dest_dir=tmp_path / "data", eval_fraction=0.2))
    train = (tmp_path / "data" / "train.jsonl").read_text().splitlines()
    held_out = (tmp_path / "data" / "eval.jsonl").read_text().splitlines()
    expected_eval = [i for i in range(3000) if split_of(f"Say {i}", 0.2) == "eval"]
    assert [json.loads(x)["prompt"] for x in held_out if x.startswith('{"prompt')] == [
        f"Say {i}" for i in expected_eval
    ]
    assert len(train) + len(held_out) == 3001  # the broken line is kept for validate_data; the blank one dropped
    manifest = json.loads((tmp_path / "data" / "manifest.json").read_text())
    for entry in manifest["derived"]:
        data = (tmp_path / "data" / entry["path"]).read_bytes()
        assert (len(data), hashlib.sha256(data).hexdigest()) == (entry["size"], entry["sha256"])
    assert out.num_files == 1
