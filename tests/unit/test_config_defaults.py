"""A pipeline's own config defaults survive any override: `--set` and `--config` merge onto them at any depth.

A pipeline declares its defaults the natural way, `train: TrainSettings = TrainSettings(max_steps=30)`; an
override of one key of a section (or of a section inside it) changes that key and keeps every other one the
pipeline declared, for its own sections and eksflow's (`retry`, `storage`, `cluster`...). A list is replaced
whole, a map merged key by key. Every shipped config loads back to itself: key by key, and from what `config` prints.
"""

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel, Field

from eksflow.cli import apply_variant
from eksflow.cluster import ClusterSettings, SlurmSettings
from eksflow.config import PipelineConfig, RetrySettings, StorageSettings, config_hash, load_config, name_field
from eksflow.config_docs import effective_yaml, rows
from eksflow.errors import ConfigError
from eksflow.llm.pipeline import LlmPipelineConfig, MlflowSettings
from eksflow.llm.serving.objects import ServingConfig
from eksflow.llm.steps.common.gate import Threshold
from eksflow.llm.steps.evaluate import EvaluateSettings
from eksflow.llm.steps.stage_data import StageSettings
from eksflow.llm.steps.train import LoraSettings, TrainSettings
from eksflow.plan import check
from eksflow.run import config_changes
from eksflow.runtime.args import Settings
from pipelines.champion_check import ChampionCheckConfig
from pipelines.llama_lora import LlamaLoraConfig, build
from pipelines.lora_sweep import LoraSweepConfig
from tests.unit.test_base_config import rendered
from tests.unit.test_pipeline import template


class Inner(Settings):
    """A section inside a section."""

    label: str = Field("class", description="text")
    level: int = Field(1, ge=1, description="a number")
    tags: tuple[str, ...] = Field(("class",), description="a list")


class Outer(Settings):
    """A section of the pipeline's own, holding another."""

    size: int = Field(1, ge=1, description="a number")
    mode: str = Field("class", description="text")
    inner: Inner = Inner()
    limits: dict[str, int] = Field({}, description="a map")


class OwnDefaults(PipelineConfig):
    """Section defaults declared in code, at two depths, for the pipeline's own sections and eksflow's."""

    name: str = name_field("own-defaults")
    outer: Outer = Outer(size=30, inner=Inner(label="mine", tags=("a", "b")), limits={"cpu": 2})
    made: Outer = Field(default_factory=lambda: Outer(mode="made"), description="a default_factory's section")
    optional: Outer | None = Outer(mode="optional")
    retry: RetrySettings = RetrySettings(limit=5, first_delay="1m")
    storage: StorageSettings = StorageSettings(fsx_claim="team-fsx")
    cluster: ClusterSettings = ClusterSettings(nodes=2, slurm=SlurmSettings(partition="gpu", qos="high"))


def loaded(how: str, tmp_path: Path, values: dict[str, Any]) -> OwnDefaults:
    """The config with `values` (dotted keys) given one way: each as `--set key=value`, or all in a --config file."""
    if how == "set":
        return load_config(
            OwnDefaults, None, [f"{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in values.items()]
        )
    tree: dict[str, Any] = {}
    for key, value in values.items():
        *sections, last = key.split(".")
        node = tree
        for section in sections:
            node = node.setdefault(section, {})
        node[last] = value
    path = tmp_path / "partial.yaml"
    path.write_text(yaml.safe_dump(tree))
    return load_config(OwnDefaults, path)


HOW = pytest.mark.parametrize("how", ["set", "config"], ids=["--set", "--config"])


@HOW
def test_a_section_keeps_every_declared_default_when_another_key_is_set(how, tmp_path):
    cfg = loaded(how, tmp_path, {"outer.mode": "given"})
    assert cfg.outer == Outer(size=30, mode="given", inner=Inner(label="mine", tags=("a", "b")), limits={"cpu": 2})
    assert cfg.made == Outer(mode="made") and cfg.optional == Outer(mode="optional")  # untouched sections


@HOW
def test_a_section_inside_a_section_keeps_its_declared_defaults(how, tmp_path):
    cfg = loaded(how, tmp_path, {"outer.inner.level": 3})
    assert cfg.outer == Outer(size=30, inner=Inner(label="mine", level=3, tags=("a", "b")), limits={"cpu": 2})


@HOW
def test_eksflows_own_sections_keep_the_pipelines_defaults(how, tmp_path):
    cfg = loaded(how, tmp_path, {"retry.max_delay": "10m", "storage.fsx_mount": "/data", "cluster.slurm.account": "t"})
    assert cfg.retry == RetrySettings(limit=5, first_delay="1m", max_delay="10m")
    assert cfg.storage == StorageSettings(fsx_claim="team-fsx", fsx_mount="/data")
    assert cfg.cluster == ClusterSettings(nodes=2, slurm=SlurmSettings(partition="gpu", qos="high", account="t"))


def test_the_rendered_workflow_keeps_the_declared_retry_under_an_override():
    strategy = template(rendered(load_config(OwnDefaults, None, ["retry.max_delay=10m"])), "make")["retryStrategy"]
    assert (strategy["limit"], strategy["backoff"]["duration"], strategy["backoff"]["cap"]) == ("5", "1m", "10m")


@HOW
def test_a_default_factorys_section_and_an_optional_one_keep_their_defaults(how, tmp_path):
    cfg = loaded(how, tmp_path, {"made.size": 4, "optional.size": 5})
    assert (cfg.made, cfg.optional) == (Outer(mode="made", size=4), Outer(mode="optional", size=5))
    assert loaded(how, tmp_path, {"optional": None}).optional is None  # null leaves an optional section out


@HOW
def test_a_list_is_replaced_whole_and_a_map_merged_key_by_key(how, tmp_path):
    cfg = loaded(how, tmp_path, {"outer.inner.tags": ["c"], "outer.limits.memory": 8})
    assert cfg.outer.inner.tags == ("c",) and cfg.outer.inner.label == "mine"
    assert cfg.outer.limits == {"cpu": 2, "memory": 8}


def test_a_config_file_then_set_merge_onto_the_defaults_together(tmp_path):
    path = tmp_path / "partial.yaml"
    path.write_text("outer:\n  inner:\n    label: from-file\n  mode: from-file\n")
    cfg = load_config(OwnDefaults, path, ["outer.inner.level=2", "outer.mode=from-set"])
    assert cfg.outer == Outer(
        size=30, mode="from-set", inner=Inner(label="from-file", level=2, tags=("a", "b")), limits={"cpu": 2}
    )


def test_what_a_section_was_given_is_its_declared_keys_and_the_overrides():
    # plan checks the layout fields a user set (num_workers, use_gpu): a merged section must not claim all of them
    cfg = load_config(OwnDefaults, None, ["outer.mode=given", "outer.inner.level=2"])
    assert cfg.outer.model_fields_set == {"size", "inner", "limits", "mode"}
    assert cfg.outer.inner.model_fields_set == {"label", "tags", "level"}
    assert cfg.cluster.model_fields_set == {"nodes", "slurm"}  # untouched: the declared instance itself


def fields_set(model: BaseModel, prefix: str = "") -> set[str]:
    """The dotted keys of the values (not sections) set in `model` and in every section inside it."""
    found = set()
    for name in type(model).model_fields:
        if isinstance(value := getattr(model, name), BaseModel):
            found |= fields_set(value, f"{prefix}{name}.")
        elif name in model.model_fields_set:
            found.add(prefix + name)
    return found


def test_a_printed_config_sets_what_the_defaults_set_and_plans_on_a_gpu_like_them(tmp_path):
    """`config > f.yaml; plan --config f.yaml --variant gpu` once refused train.num_workers and train.use_gpu,
    which the file gave only because `config` prints every key."""
    printed = tmp_path / "printed.yaml"
    printed.write_text(effective_yaml(load_config(OwnDefaults, None, ["outer.mode=given"])))
    assert fields_set(load_config(OwnDefaults, printed)) >= {"outer.mode", "outer.size", "outer.inner.label"}
    assert fields_set(load_config(OwnDefaults, printed)) == fields_set(
        load_config(OwnDefaults, None, ["outer.mode=given"])
    )
    printed.write_text(effective_yaml(load_config(LlamaLoraConfig, None, ["train.max_steps=30"])))
    cfg = apply_variant(load_config(LlamaLoraConfig, printed), "gpu")
    assert "train.use_gpu" not in fields_set(cfg) and "train.max_steps" in fields_set(cfg)
    check(build(cfg))  # no `train.use_gpu: False on gpu nodes`
    with pytest.raises(ConfigError, match=r"^train.num_workers: 3 does not match"):
        check(build(apply_variant(load_config(LlamaLoraConfig, printed, ["train.num_workers=3"]), "gpu")))


def test_a_bad_override_is_still_one_line_naming_its_key():
    with pytest.raises(ConfigError) as err:
        load_config(OwnDefaults, None, ["outer.inner.level=0"])
    assert str(err.value).startswith("outer.inner.level: Input should be greater than or equal to 1 (got 0)")
    assert "\n" not in str(err.value)


class Text2SqlConfig(LlmPipelineConfig):
    """The issue's user pipeline: its own data, training, registry name, metrics and gate."""

    name: str = name_field("text2sql")
    data: StageSettings = StageSettings(source="data/text2sql")
    train: TrainSettings = TrainSettings(max_steps=30, lora=LoraSettings(rank=8, alpha=16))
    mlflow: MlflowSettings = MlflowSettings(model_name="text2sql")
    evaluate: EvaluateSettings = EvaluateSettings(
        task_metrics=("contains",), thresholds=(Threshold(metric="contains", value=0.5),), champion_metric="contains"
    )


@pytest.mark.parametrize(
    "override",
    [
        "data.concurrency=4",
        "mlflow.ui_url=http://mlflow.example.com",
        "evaluate.batch_size=8",
        "train.lora.dropout=0.1",
        "env.TOKENIZERS_PARALLELISM=false",
    ],
    ids=["data-source", "model-name", "metrics-and-gate", "lora-inside-train", "hub-offline"],
)
def test_the_issues_overrides_keep_the_users_own_llm_defaults(override):
    """`--set data.concurrency=4` once trained on the demo data, `mlflow.ui_url` registered into llama-lora,
    `evaluate.batch_size` dropped the user's metric and gate, any `env` entry dropped HF_HUB_OFFLINE."""
    cfg = load_config(Text2SqlConfig, None, [override])
    (changed,) = config_changes(Text2SqlConfig().model_dump(mode="json"), cfg.model_dump(mode="json"))
    assert changed.startswith(override.split("=")[0] + " (")  # that key, and no other


# the repository's pipelines, the serving objects' config, and this file's two pipelines of their own defaults
CONFIGS = [LlamaLoraConfig, LoraSweepConfig, ChampionCheckConfig, ServingConfig, Text2SqlConfig, OwnDefaults]


def leaves(tree: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """Every dotted key of a dumped config (map entries included) and its value."""
    found = []
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            found += leaves(value, f"{prefix}{key}.")
        else:
            found.append((f"{prefix}{key}", value))
    return found


@pytest.mark.parametrize("config_type", CONFIGS, ids=lambda t: t.__name__)
def test_every_config_loads_back_to_itself(config_type, tmp_path):
    """A dumped default validates to itself, `config`'s YAML reloads to the same config, and so does every key set to
    its own value: no validator changes a value it has already accepted, so keeping a default is exact."""
    cfg = load_config(config_type)
    assert config_type.model_validate(cfg.model_dump(mode="python")) == cfg
    printed = tmp_path / "printed.yaml"
    printed.write_text(effective_yaml(cfg))
    assert load_config(config_type, printed) == cfg
    assert config_hash(load_config(config_type, printed)) == config_hash(cfg)  # lineage: the same settings, one hash
    for key, value in leaves(cfg.model_dump(mode="json")):
        text = value if isinstance(value, str) else json.dumps(value)
        assert load_config(config_type, None, [f"{key}={text}"]) == cfg, key


def test_a_choice_of_numbers_is_set_as_a_number():
    # `serving.engine.max_lora_rank` is a Literal of vLLM's ranks: `--set ...=32` was read as the text '32'
    assert load_config(LlamaLoraConfig, None, ["serving.engine.max_lora_rank=32"]).serving.engine.max_lora_rank == 32


def test_config_keys_show_the_declared_defaults_the_loaded_config_has():
    cfg = load_config(Text2SqlConfig, None, ["data.concurrency=4"])
    shown = {key: default for key, _, default, _ in rows(Text2SqlConfig)}
    assert shown["data.source"] == "'data/text2sql'" and cfg.data.source == "data/text2sql"
    assert shown["mlflow.model_name"] == "'text2sql'" and cfg.mlflow.model_name == "text2sql"


def test_an_unchanged_default_config_is_the_declared_one():
    for config_type in CONFIGS:
        cfg = load_config(config_type)
        assert cfg == config_type() and config_hash(cfg) == config_hash(config_type())
