"""Pipeline config: defaults, YAML + --set overrides, and errors that name the field and the fix (S3)."""

import json
import re

import pytest

from eksflow.config import MAX_TEXT_BYTES, PipelineConfig, config_hash, load_config, name_field
from eksflow.errors import ConfigError
from eksflow.llm.pipeline import LlmPipelineConfig, MlflowSettings
from pipelines.champion_check import ChampionCheckConfig
from pipelines.llama_lora import LlamaLoraConfig
from pipelines.lora_sweep import LoraSweepConfig
from tests.flagship import config, rendered


def test_defaults_are_valid():
    cfg = config()
    assert cfg == LlamaLoraConfig()
    assert cfg.base_model == "smollm2-135m-instruct"
    assert (cfg.experiment, cfg.model_name) == ("llama-lora", "llama-lora")  # one experiment per pipeline


def test_yaml_then_set_overrides(tmp_path):
    path = tmp_path / "cfg.yaml"
    path.write_text("train:\n  max_steps: 7\n  lora: {rank: 4}\nevaluate:\n  max_examples: 5\n")
    cfg = config(["train.max_steps=9", "data.source=s3://bucket/data"], path)
    assert (cfg.train.max_steps, cfg.train.lora.rank, cfg.evaluate.max_examples) == (9, 4, 5)
    assert cfg.data.source == "s3://bucket/data"


def test_each_pipeline_validates_against_its_own_model():
    with pytest.raises(ConfigError, match=r"^train: unknown key; valid keys: "):
        load_config(PipelineConfig, None, ["train.max_steps=3"])  # the base has no train section


def test_all_errors_are_reported_at_once_with_field_and_fix():
    with pytest.raises(ConfigError) as err:
        config(["train.learning_rate=-1", "train.lr=1", "image=repo/steps:latest"])
    lines = str(err.value).splitlines()
    assert len(lines) == 3
    assert lines[0].startswith("image:") and "not pinned" in lines[0]
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
        "evaluate.thresholds=[{metric: exact_match, value: .nan}]",
        "evaluate.thresholds=[{metric: exact_match, value: 0.5, op: '=='}]",
    ],
    ids=["nan-value", "unknown-op"],
)
def test_the_fix_hinted_for_a_list_item_is_a_set_that_loads(override):
    # --set takes no index: the hint sets the whole list (it once read `--set evaluate.thresholds.value=<value>`)
    with pytest.raises(ConfigError) as err:
        config([override])
    (line,) = str(err.value).splitlines()
    hinted = re.search(r"fix it with --set (\S+)=<value>", line)
    assert hinted is not None and hinted.group(1) == "evaluate.thresholds", line
    fixed = config([f"{hinted.group(1)}=[{{metric: exact_match, value: 0.5}}]"])
    assert fixed.evaluate.thresholds[0].value == 0.5


@pytest.mark.parametrize(
    ("override", "says"),
    [
        ("train", r"^--set 'train': expected dotted\.key=value, e\.g\. --set train\.max_steps=20$"),
        ("train.max_steps=0", r"^train\.max_steps: Input should be greater than or equal to 1 \(got 0\); fix it with "),
        ("name=Bad_Name", r"^name: String should match pattern .* \(got 'Bad_Name'\); fix it with --set name=<value>"),
        (
            "evaluate.thresholds=[{metric: bogus, value: 1}]",
            r"^evaluate\.thresholds: .*unknown metric 'bogus'; known metrics: eval_loss, .*fix it with --set ",
        ),
        ("train.max_steps=ten", r"^train\.max_steps: Input should be a valid integer.* \(got 'ten'\); fix it with "),
        ("train.max_steps=[1", r"^--set train\.max_steps: takes a whole number, got '\[1'$"),
        (
            "train.lora=@x",
            r"^--set train\.lora: found character '@' .*; quote text, e\.g\. --set 'train\.lora=\"\.\.\.\"'$",
        ),
        (".x=1", r"^--set '\.x=1': expected dotted\.key=value"),
    ],
    ids=["no-equals", "out-of-range", "k8s-name", "unknown-metric", "wrong-type", "bad-yaml", "yaml-reserved", "empty"],
)
def test_bad_overrides_raise_config_error_naming_the_key_and_the_fix(override, says):
    with pytest.raises(ConfigError, match=says) as refused:
        config([override])
    assert len(str(refused.value).splitlines()) == 1  # one line per problem


@pytest.mark.parametrize(
    "text",
    ["'''", '"', "`", "[1", "@x", "!!python/object:os.system x", "a\nb", "1976", "true", "null", "a: b", "  padded  "],
)
def test_a_text_field_takes_the_set_value_as_given(text):
    assert config([f"mlflow.experiment={text}"]).mlflow.experiment == text


@pytest.mark.parametrize(
    "override",
    ['mlflow.experiment=x {{=sprig.env("HOME")}}', "mlflow.tracking_uri=sqlite:////fsx/wn-{{workflow.name}}.db"],
)
def test_argo_expressions_in_text_are_refused_naming_the_field(override):
    key = override.split("=", 1)[0]
    with pytest.raises(ConfigError, match=rf"^{key}: holds '{{{{', which Argo would evaluate"):
        config([override])


def test_text_longer_than_an_argv_item_may_be_is_refused():
    with pytest.raises(ConfigError, match=rf"^base_model: {MAX_TEXT_BYTES + 1} bytes of text; at most"):
        config(["base_model=" + "a" * (MAX_TEXT_BYTES + 1)])


def test_missing_unreadable_and_malformed_config_files(tmp_path):
    with pytest.raises(ConfigError, match="file not found"):
        config(path=tmp_path / "nope.yaml")
    (tmp_path / "bad.yaml").write_text("train: [x\n")
    with pytest.raises(ConfigError, match=r"invalid YAML at line 2"):
        config(path=tmp_path / "bad.yaml")
    (tmp_path / "latin1.yaml").write_bytes("base_model: caf\xe9\n".encode("latin-1"))
    with pytest.raises(ConfigError, match="not UTF-8"):
        config(path=tmp_path / "latin1.yaml")
    (tmp_path / "list.yaml").write_text("- a\n")
    with pytest.raises(ConfigError, match="expected a mapping"):
        config(path=tmp_path / "list.yaml")


class Text2SqlConfig(LlmPipelineConfig):
    name: str = name_field("text2sql")


class Text2SqlOwnMlflow(LlmPipelineConfig):
    """A pipeline redeclaring the section for another key leaves model_name to the pipeline's name too."""

    name: str = name_field("text2sql")
    mlflow: MlflowSettings = MlflowSettings(ui_url="http://mlflow.example.com")


@pytest.mark.parametrize("config_type", [Text2SqlConfig, Text2SqlOwnMlflow], ids=["inherited", "redeclared"])
def test_a_pipeline_registers_into_its_own_name_unless_one_is_configured(config_type):
    cfg = load_config(config_type)
    assert cfg.mlflow.model_name == cfg.model_name == cfg.tracking.model_name == "text2sql"
    assert load_config(config_type, None, ["mlflow.experiment=sql"]).model_name == "text2sql"
    assert load_config(config_type, None, ["name=sql-nightly"]).model_name == "sql-nightly"
    assert load_config(config_type, None, ["mlflow.model_name=shared"]).model_name == "shared"


def test_the_flagship_renamed_registers_serves_and_reports_under_its_new_name():
    manifest = json.dumps(rendered(["name=text2sql"]))
    assert "--model-name=text2sql" in manifest and "llama-lora" not in manifest


def test_the_flagship_sweep_and_champion_check_keep_the_flagships_model():
    for config_type in (LlamaLoraConfig, LoraSweepConfig, ChampionCheckConfig):
        assert load_config(config_type).model_name == "llama-lora", config_type.__name__
    # Left to the pipeline's name or named, the same settings: one lineage hash
    assert config_hash(config()) == config_hash(config(["mlflow.model_name=llama-lora"]))
