"""Pipeline config: defaults, YAML + --set overrides, and errors that name the field and the fix (S3)."""

import pytest

from eksflow.config import ConfigError, PipelineConfig, load_config


def test_defaults_are_valid():
    cfg = load_config()
    assert cfg == PipelineConfig()
    assert cfg.base_model == "smollm2-135m-instruct"


def test_yaml_then_set_overrides(tmp_path):
    path = tmp_path / "cfg.yaml"
    path.write_text("train:\n  max_steps: 7\n  lora: {rank: 4}\nevaluate:\n  max_examples: 5\n")
    cfg = load_config(path, ["train.max_steps=9", "data.source=s3://bucket/data"])
    assert (cfg.train.max_steps, cfg.train.lora.rank, cfg.evaluate.max_examples) == (9, 4, 5)
    assert cfg.data.source == "s3://bucket/data"


def test_all_errors_are_reported_at_once_with_field_and_fix():
    with pytest.raises(ConfigError) as err:
        load_config(None, ["train.learning_rate=-1", "train.lr=1", "images.steps=repo/steps:latest"])
    lines = str(err.value).splitlines()
    assert len(lines) == 3
    assert lines[0].startswith("images.steps:") and "not pinned" in lines[0]
    assert any(
        line.startswith("train.learning_rate: Input should be greater than 0 (got -1)")
        and "--set train.learning_rate=" in line
        for line in lines
    )
    assert any(
        line.startswith("train.lr: unknown key; valid keys in train:") and "learning_rate" in line for line in lines
    )


@pytest.mark.parametrize(
    "override",
    [
        "train",
        "train.max_steps=0",
        "name=Bad_Name",
        "evaluate.thresholds=[{metric: bogus, value: 1}]",
        "train.max_steps=ten",
    ],
    ids=["no-equals", "out-of-range", "k8s-name", "unknown-metric", "wrong-type"],
)
def test_bad_overrides_raise_config_error(override):
    with pytest.raises(ConfigError):
        load_config(None, [override])


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="file not found"):
        load_config(tmp_path / "nope.yaml")
