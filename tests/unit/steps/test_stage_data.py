from __future__ import annotations

import hashlib
import json
import uuid
from pathlib import Path

import pytest
from pydantic import ValidationError

from eksflow.llm.steps.common.storage import s3_client
from eksflow.llm.steps.stage_data import Args
from eksflow.llm.steps.stage_data.manifest import ManifestEntry, manifest_digest
from eksflow.llm.steps.stage_data.step import main, run
from eksflow.runtime.args import StepInputError

TRAIN = b'{"prompt": "Date: May 1, 2020", "completion": "2020-05-01"}\n'
EVAL = b'{"prompt": "Date: 2 June 2021", "completion": "2021-06-02"}\n'


def make_source(folder: Path, extra: dict[str, bytes] | None = None) -> Path:
    files = {"train.jsonl": TRAIN, "eval.jsonl": EVAL, **(extra or {})}
    for name, data in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    return folder


def stage(source: str | Path, dest: Path, **settings: object) -> tuple[Path, dict]:
    outputs = run(Args(source=str(source), dest_dir=dest, **settings))
    assert Path(outputs.dataset_dir) == dest.absolute()
    manifest = json.loads((dest / "manifest.json").read_text())
    assert outputs.dataset_digest == manifest["digest"]
    assert outputs.num_files == len(manifest["files"])
    assert outputs.num_bytes == sum(f["size"] for f in manifest["files"])
    return dest, manifest


def files_under(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*")} if root.exists() else set()


def make_bucket(objects: dict[str, bytes]) -> str:
    bucket = f"eksflow-{uuid.uuid4().hex[:12]}"
    client = s3_client()
    client.create_bucket(Bucket=bucket)
    for key, body in objects.items():
        client.put_object(Bucket=bucket, Key=key, Body=body)
    return bucket


def test_stages_local_folder_with_manifest(tmp_path):
    source = make_source(tmp_path / "src", {"docs/README.md": b"dates\n"})
    dest, manifest = stage(source, tmp_path / "fsx" / "wf" / "data", concurrency=2)

    raw = {"raw", "raw/train.jsonl", "raw/eval.jsonl", "raw/docs", "raw/docs/README.md"}
    assert files_under(dest) == {"train.jsonl", "eval.jsonl", "manifest.json", *raw}
    assert (dest / "train.jsonl").read_bytes() == TRAIN
    assert (dest / "train.jsonl").samefile(dest / "raw" / "train.jsonl")  # already prompt/completion: linked
    assert manifest["source"] == str(source)
    assert [f["key"] for f in manifest["files"]] == ["docs/README.md", "eval.jsonl", "train.jsonl"]
    for entry in manifest["files"]:
        data = (source / entry["key"]).read_bytes()
        assert entry["size"] == len(data)
        assert entry["sha256"] == hashlib.sha256(data).hexdigest()
        assert entry["etag"] == f"mtime:{(source / entry['key']).stat().st_mtime_ns}"
    assert [d["path"] for d in manifest["derived"]] == ["train.jsonl", "eval.jsonl"]
    assert manifest["digest"].startswith("sha256:") and len(manifest["digest"]) == len("sha256:") + 64
    assert files_under(dest.parent) == {"data", *(f"data/{p}" for p in files_under(dest))}  # no temp siblings


def test_file_uri_and_local_path_give_the_same_digest(tmp_path):
    source = make_source(tmp_path / "src")
    _, by_path = stage(source, tmp_path / "a" / "data")
    _, by_uri = stage(source.as_uri(), tmp_path / "b" / "data")
    assert by_uri["digest"] == by_path["digest"]
    assert by_uri["source"] == source.as_uri()


def test_stages_from_s3_prefix(s3_env, tmp_path):
    nested = {f"shards/part-{i:02d}.jsonl": TRAIN * (i + 1) for i in range(12)}
    objects = {f"datasets/dates/{k}": v for k, v in {"train.jsonl": TRAIN, "eval.jsonl": EVAL, **nested}.items()}
    objects["datasets/dates/"] = b""  # a console "folder" marker: skipped
    objects["datasets/dates2/train.jsonl"] = b"not this one"  # shares the prefix text, not the folder
    bucket = make_bucket(objects)

    dest, manifest = stage(f"s3://{bucket}/datasets/dates", tmp_path / "fsx" / "data", concurrency=4)

    raw = {f"raw/{p}" for p in ("train.jsonl", "eval.jsonl", "shards", *nested)}
    assert files_under(dest) == {"train.jsonl", "eval.jsonl", "manifest.json", "raw", *raw}
    assert (dest / "raw/shards/part-03.jsonl").read_bytes() == TRAIN * 4
    etags = {f["key"]: f["etag"] for f in manifest["files"]}
    assert etags["train.jsonl"] == hashlib.md5(TRAIN).hexdigest()  # the S3 ETag of a single-part upload
    _, local = stage(make_source(tmp_path / "src", nested), tmp_path / "local" / "data")
    assert manifest["digest"] == local["digest"]  # the digest is about content, not where it came from


def test_main_writes_outputs(tmp_path):
    source = make_source(tmp_path / "src")
    out = tmp_path / "out"
    code = main([f"--source={source}", f"--dest-dir={tmp_path / 'data'}", f"--outputs-dir={out}"])
    assert code == 0
    assert sorted(p.name for p in out.iterdir()) == [
        "changed",
        "copied_files",
        "data_key",
        "dataset_digest",
        "dataset_dir",
        "num_bytes",
        "num_files",
        "reason",
    ]
    assert (out / "changed").read_text() == "true"
    assert (out / "reason").read_text() == "no earlier training data to compare with"
    assert (out / "num_files").read_text() == "2"
    assert (out / "num_bytes").read_text() == str(len(TRAIN) + len(EVAL))
    assert (out / "dataset_digest").read_text().startswith("sha256:")


def test_restage_replaces_the_old_copy_whole(tmp_path):
    dest = tmp_path / "fsx" / "data"
    _, first = stage(make_source(tmp_path / "v1", {"old.txt": b"only in v1"}), dest)
    (tmp_path / "fsx" / ".data.tmp-killedrun").mkdir()  # left behind by a run killed mid-copy
    (tmp_path / "fsx" / ".data.tmp-killedrun" / "train.jsonl").write_bytes(b"partial")

    v2 = make_source(tmp_path / "v2")
    (v2 / "train.jsonl").write_bytes(TRAIN * 2)
    _, second = stage(v2, dest)

    assert files_under(dest) == {
        "train.jsonl",
        "eval.jsonl",
        "manifest.json",
        "raw",
        "raw/train.jsonl",
        "raw/eval.jsonl",
    }
    assert (dest / "train.jsonl").read_bytes() == TRAIN * 2
    assert second["digest"] != first["digest"]
    assert sorted(p.name for p in (tmp_path / "fsx").iterdir()) == ["data"]


def test_failed_restage_keeps_the_published_copy(tmp_path):
    dest = tmp_path / "fsx" / "data"
    _, first = stage(make_source(tmp_path / "v1"), dest)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "train.jsonl").write_bytes(TRAIN)

    with pytest.raises(StepInputError):
        stage(broken, dest)

    assert json.loads((dest / "manifest.json").read_text()) == first
    assert sorted(p.name for p in (tmp_path / "fsx").iterdir()) == ["data"]


@pytest.mark.parametrize(
    ("files", "missing"),
    [
        ({"train.jsonl": TRAIN}, "eval.jsonl"),
        ({"eval.jsonl": EVAL}, "train.jsonl"),
        ({"x.txt": b"x"}, "train.jsonl and eval.jsonl"),
    ],
    ids=["no-eval", "no-train", "neither"],
)
def test_missing_split_is_named(tmp_path, files, missing):
    source = tmp_path / "src"
    for name, data in files.items():
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        (source / name).write_bytes(data)
    with pytest.raises(StepInputError, match=rf"missing {missing}; expected <source>/train.jsonl"):
        stage(source, tmp_path / "fsx" / "data")
    assert not (tmp_path / "fsx").exists()


def test_missing_local_folder_exits_2(tmp_path, capsys):
    code = main([f"--source={tmp_path / 'nope'}", f"--dest-dir={tmp_path / 'data'}", f"--outputs-dir={tmp_path}/o"])
    assert code == 2
    assert "does not exist" in capsys.readouterr().err


def test_missing_bucket_is_a_clear_error(s3_env, tmp_path):
    with pytest.raises(StepInputError, match=r"bucket 'eksflow-no-such-bucket' .* does not exist"):
        stage("s3://eksflow-no-such-bucket/data", tmp_path / "data")


def test_missing_prefix_is_a_clear_error(s3_env, tmp_path):
    bucket = make_bucket({"other/train.jsonl": TRAIN})
    with pytest.raises(StepInputError, match=r"no objects under .*check the prefix"):
        stage(f"s3://{bucket}/datasets/dates", tmp_path / "data")


@pytest.mark.parametrize(
    "key",
    ["data/../evil.jsonl", "data/sub/../../evil.jsonl", "data//evil.jsonl", "data/./evil.jsonl"],
    ids=["dotdot", "nested-dotdot", "absolute", "dot"],
)
def test_escaping_s3_keys_are_refused(s3_env, tmp_path, key):
    bucket = make_bucket({"data/train.jsonl": TRAIN, "data/eval.jsonl": EVAL, key: b"pwned"})
    with pytest.raises(StepInputError, match="refusing to stage it"):
        stage(f"s3://{bucket}/data", tmp_path / "fsx" / "wf" / "data")
    assert not (tmp_path / "fsx").exists()
    assert not list(tmp_path.rglob("evil.jsonl"))


@pytest.mark.parametrize("kind", ["file", "folder"])
def test_symlink_out_of_a_local_source_is_refused(tmp_path, kind):
    outside = tmp_path / "secrets"
    outside.mkdir()
    (outside / "key.pem").write_bytes(b"secret")
    source = make_source(tmp_path / "src")
    link = source / ("extra.pem" if kind == "file" else "more")
    link.symlink_to(outside / "key.pem" if kind == "file" else outside)

    with pytest.raises(StepInputError, match="points outside the source"):
        stage(source, tmp_path / "fsx" / "data")
    assert not (tmp_path / "fsx").exists()


def test_symlink_inside_a_local_source_is_copied_as_a_file(tmp_path):
    source = make_source(tmp_path / "src", {"versions/v2.jsonl": TRAIN * 3})
    (source / "train.jsonl").unlink()
    (source / "train.jsonl").symlink_to("versions/v2.jsonl")
    (source / "loop").symlink_to(".")  # a loop back to the root must not hang the walk

    with pytest.raises(StepInputError, match="loops back"):
        stage(source, tmp_path / "a" / "data")
    (source / "loop").unlink()
    dest, _ = stage(source, tmp_path / "b" / "data")
    assert not (dest / "raw" / "train.jsonl").is_symlink()
    assert (dest / "train.jsonl").read_bytes() == TRAIN * 3


def test_digest_is_stable_and_changes_with_one_byte(tmp_path):
    source = make_source(tmp_path / "src")
    _, first = stage(source, tmp_path / "a" / "data")
    _, again = stage(source, tmp_path / "b" / "data")
    _, restaged = stage(tmp_path / "a" / "data" / "raw", tmp_path / "c" / "data")  # the same bytes elsewhere
    data = bytearray((source / "eval.jsonl").read_bytes())
    data[10] ^= 0x01
    (source / "eval.jsonl").write_bytes(bytes(data))
    _, flipped = stage(source, tmp_path / "d" / "data")

    assert again["digest"] == first["digest"] == restaged["digest"]
    assert flipped["digest"] != first["digest"]


def test_manifest_digest_ignores_order_and_sees_paths():
    a, b = ManifestEntry("a.jsonl", 1, "0" * 64), ManifestEntry("b.jsonl", 1, "1" * 64)
    assert manifest_digest([a, b]) == manifest_digest([b, a])
    assert manifest_digest([a, b]) != manifest_digest([ManifestEntry("c.jsonl", 1, "0" * 64), b])


@pytest.mark.parametrize("concurrency", [0, 65])
def test_concurrency_is_bounded(tmp_path, concurrency):
    with pytest.raises(ValidationError, match="concurrency"):
        Args(dest_dir=tmp_path, concurrency=concurrency)
