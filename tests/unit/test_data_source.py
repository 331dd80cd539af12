"""`data.source`: one rule on both sides. A relative path is the caller's folder's, recorded absolute in the run;
a malformed URI is refused with exit 2 before anything runs."""

import pytest

from eksflow.config import load_config
from eksflow.render import manifest
from eksflow.run import localized
from pipelines.llama_lora import LlamaLoraConfig, build
from tests.commands import ROOT, python


@pytest.mark.parametrize(
    ("source", "why"),
    [
        ("", "is empty"),
        ("s3://", "names no valid bucket"),
        ("s3://Bad_Bucket!/x", "names no valid bucket"),
        ("s3://bucket/../../x", "has '.', '..' or empty parts"),
        ("s3://bucket/a//b", "has '.', '..' or empty parts"),
        ("file://../../etc", "is not file:///absolute/path"),
        ("gs://bucket/x", "has a scheme eksflow does not read"),
    ],
    ids=["empty", "no-bucket", "bad-bucket", "dot-dot", "empty-part", "relative-file-uri", "other-scheme"],
)
def test_a_malformed_source_is_refused_before_anything_runs(tmp_path, source, why):
    flagship = str(ROOT / "pipelines" / "llama_lora.py")
    done = python(
        flagship, "run", "--set", f"data.source={source}", "--state-dir", str(tmp_path / "state"), cwd=tmp_path
    )
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("config error: data.source: ") and why in line, line
    assert not (tmp_path / "state").exists()


def test_a_relative_source_means_the_callers_folder_and_is_recorded_absolute(tmp_path):
    cfg = localized(load_config(LlamaLoraConfig, None, ["data.source=mydata"]), tmp_path)
    assert cfg.data.source == str(tmp_path / "mydata")
    parameters = {p["name"]: p["value"] for p in manifest(build(cfg))["spec"]["arguments"]["parameters"]}
    assert parameters["data_source"] == str(tmp_path / "mydata")
    for kept in ("s3://bucket/dates", "file:///data/dates", "/abs/dates"):
        assert localized(load_config(LlamaLoraConfig, None, [f"data.source={kept}"]), tmp_path).data.source == kept


def test_the_step_refuses_the_same_sources(tmp_path):
    folders = [f"--dest-dir={tmp_path / 'd'}", f"--outputs-dir={tmp_path / 'out'}"]
    done = python("-m", "eksflow.llm.steps.stage_data", "--source=s3://Bad_Bucket!/x", *folders)
    assert done.returncode == 2 and "names no valid bucket" in done.stderr, done.stderr
