"""eksflow's base config fits any pipeline: its image, env, retry and cleanup reach the rendered Workflow, and the
LLM pipelines' sections (tracking, model cache, training cluster, serving images) are theirs, not the base's."""

import pytest
from pydantic import ValidationError

from eksflow import ClusterSettings, Pipeline, PipelineConfig, distributed, image_field, name_field, retry, task
from eksflow.config import load_config
from eksflow.errors import ConfigError
from eksflow.render import manifest
from tests.unit.test_pipeline import MakeArgs, MakeOutputs, make, step, template


class ProjectConfig(PipelineConfig):
    name: str = name_field("project")
    image: str = image_field("registry.example.com/project/steps:1.2")


def rendered(cfg: PipelineConfig, body=lambda: task(make, out_dir="/fsx/out")) -> dict:
    with Pipeline(cfg, title="test") as p:
        body()
    return manifest(p)


def test_the_base_holds_what_any_pipeline_needs_and_nothing_of_llms():
    keys = set(PipelineConfig.model_fields)
    assert keys == {
        "name", "namespace", "service_account", "image", "env", "active_deadline_seconds", "memoize",
        "memoize_max_age", "storage", "retry", "cleanup",
    }  # fmt: skip
    assert not {"mlflow", "cluster", "images", "serving", "base_model"} & keys


def test_a_project_sets_its_own_step_image_in_code_and_a_deployment_overrides_it():
    container = template(rendered(ProjectConfig()), "make")["container"]
    assert container["image"] == "registry.example.com/project/steps:1.2"
    assert {"name": "EKSFLOW_IMAGE", "value": container["image"]} in container["env"]
    overridden = load_config(ProjectConfig, overrides=["image=registry.example.com/project/steps@sha256:" + "a" * 64])
    assert template(rendered(overridden), "make")["container"]["image"].endswith("a" * 64)


def test_an_unpinned_image_is_refused_in_code_and_in_config():
    class Unpinned(PipelineConfig):
        image: str = image_field("registry.example.com/project/steps:latest")

    with pytest.raises(ValidationError, match="not pinned"):
        Unpinned()
    with pytest.raises(ConfigError, match=r"^image: .*not pinned"):
        load_config(ProjectConfig, overrides=["image=registry.example.com/steps"])


def test_env_reaches_every_step_as_text_and_reserved_names_are_refused():
    cfg = load_config(ProjectConfig, overrides=["env.HF_HUB_OFFLINE=1", "env.MODE=fast mode"])
    env = template(rendered(cfg), "make")["container"]["env"]
    assert env[:2] == [{"name": "HF_HUB_OFFLINE", "value": "1"}, {"name": "MODE", "value": "fast mode"}]
    with pytest.raises(ConfigError, match="EKSFLOW_IMAGE: names starting EKSFLOW_ or ARGO_ are reserved"):
        load_config(ProjectConfig, overrides=["env.EKSFLOW_IMAGE=x"])
    with pytest.raises(ConfigError, match="is not an environment variable name"):
        load_config(ProjectConfig, overrides=["env.a-b=1"])


def test_retry_and_cleanup_come_from_the_config_and_a_task_may_set_its_own_retry():
    cfg = load_config(
        ProjectConfig,
        overrides=[
            "retry.limit=5",
            "retry.max_delay=1h",
            "cleanup.pod_gc=OnWorkflowCompletion",
            "cleanup.keep_failed_s=60",
        ],
    )

    def body():
        task(make, out_dir="/fsx/out")
        task(make, task_name="once", out_dir="/fsx/out", retry_strategy=retry(0))

    workflow = rendered(cfg, body)
    strategy = template(workflow, "make")["retryStrategy"]
    assert strategy["limit"] == "5" and strategy["backoff"]["cap"] == "1h"
    assert strategy["expression"] == "asInt(lastRetry.exitCode) != 2"  # bad input is never retried
    assert template(workflow, "once")["retryStrategy"]["limit"] == "0"
    assert workflow["spec"]["podGC"] == {"strategy": "OnWorkflowCompletion"}
    assert workflow["spec"]["ttlStrategy"] == {"secondsAfterSuccess": 7 * 24 * 3600, "secondsAfterFailure": 60}


class LayoutArgs(MakeArgs):
    num_workers: int = 1
    cpus_per_worker: int = 1
    use_gpu: bool = False


train = step("train", LayoutArgs, MakeOutputs)


def test_a_distributed_step_needs_a_cluster_section_and_says_how_to_add_it():
    settings = LayoutArgs(out_dir="/fsx/out")
    with pytest.raises(ConfigError, match=r"ProjectConfig has no `cluster: ClusterSettings` section.*add"):
        rendered(ProjectConfig(), lambda: distributed(train, settings))

    class TrainingConfig(ProjectConfig):
        cluster: ClusterSettings = ClusterSettings()

    workflow = rendered(TrainingConfig(), lambda: distributed(train, settings))
    assert template(workflow, "train")["container"]["image"] == ClusterSettings().image
