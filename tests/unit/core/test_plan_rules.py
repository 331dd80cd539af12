"""One test per `plan` rule: each refuses the bad config naming the field and the fix, and passes the default."""

import re
import shlex

import pytest
import yaml

from eksflow import plan
from eksflow.cli import check_schedule
from eksflow.config import config_type, load_config
from eksflow.errors import ConfigError
from eksflow.launchers.rayjob import entrypoint
from eksflow.llm.serving.objects import ServingConfig
from eksflow.llm.steps.train import TrainSettings
from eksflow.profiles import PROFILES
from pipelines import llama_lora, lora_sweep
from tests.commands import python
from tests.flagship import config, pipeline


def problems(*overrides):
    with pytest.raises(ConfigError) as err:
        plan.check(pipeline(overrides))
    return str(err.value).splitlines()


def test_defaults_and_every_profile_pass():
    for instance_type in PROFILES:
        rows = dict(plan.check(pipeline([f"cluster.instance_type={instance_type}"])).rows)
        assert rows["train: cost per hour"].startswith("$")


def test_memory_that_cannot_fit_is_refused():
    (line,) = problems("base_model=llama-3-70b", "cluster.instance_type=g5.12xlarge")
    assert line.startswith("train.micro_batch_size:") and "gradient_checkpointing" in line


def test_unknown_model_size_asks_for_it():
    (line,) = problems("base_model=/models/mystery")
    assert line.startswith("cluster.model_params_b:") and "--set cluster.model_params_b=" in line


def test_world_size_must_match_the_profile():
    (line,) = problems("cluster.instance_type=p4d.24xlarge", "train.num_workers=4")
    assert line.startswith("train.num_workers:") and "--set train.num_workers=8" in line


def test_cpu_workers_must_fit_the_node():
    (line,) = problems("train.num_workers=20")
    assert line.startswith("train.num_workers:")


def test_efa_across_nodes_needs_one_zone():
    (line,) = problems("cluster.instance_type=p5.48xlarge", "cluster.nodes=2")
    assert line.startswith("cluster.zone:")
    plan.check(pipeline(["cluster.instance_type=p5.48xlarge", "cluster.nodes=2", "cluster.zone=us-west-2a"]))


def test_spot_requires_checkpoints_before_the_end():
    (line,) = problems("cluster.spot=true", "train.checkpoint_every=24")
    assert line.startswith("train.checkpoint_every:")


def test_retry_layers_stay_within_the_budget():
    cfg = config(["cluster.instance_type=g5.12xlarge", "cluster.backoff_limit=2"])
    (job,) = pipeline(["cluster.instance_type=g5.12xlarge", "cluster.backoff_limit=2"]).jobs
    assert job.attempts(cfg) == 2 * 3 * 2  # Argo x RayJob x Ray Train's own restart of the worker group
    (line,) = problems("cluster.instance_type=g5.12xlarge", "cluster.backoff_limit=3")
    assert line.startswith("cluster.retry_budget:")


@pytest.mark.parametrize("launcher", ["rayjob", "mpijob", "slurm", "trainjob"])
def test_several_cpu_nodes_plan_as_they_render_and_run_one_worker_per_node(launcher):
    """render and run spread a CPU job over its nodes with these launchers: plan and submit take it too.

    Each node holds one worker: 10 CPUs each fit a 16-vCPU node, though 2 x 10 would not fit one.
    """
    overrides = ["cluster.nodes=2", f"cluster.launcher={launcher}", "train.cpus_per_worker=10"]
    rows = dict(plan.check(pipeline(overrides)).rows)
    assert rows["train: instance"].startswith("m6i.4xlarge x 2 (cpu")
    assert rows["train: world size"] == "2 workers"


@pytest.mark.parametrize(("launcher", "lines"), [("container", 1), ("volcano", 2)])
def test_several_cpu_nodes_in_one_pod_are_refused_by_every_command(launcher, lines):
    """The container launcher's one pod is on one node: render and run refuse it as plan does (it builds nothing)."""
    with pytest.raises(ConfigError) as refused:
        pipeline(["cluster.nodes=2", f"cluster.launcher={launcher}"])
    *_, line = str(refused.value).splitlines()
    assert len(str(refused.value).splitlines()) == lines
    assert line.startswith("cluster.nodes: 2 CPU nodes, but the container launcher runs the job in one pod")
    assert "--set cluster.launcher=rayjob" in line


def test_every_problem_is_reported_at_once():
    assert len(problems("cluster.instance_type=p4d.24xlarge", "cluster.nodes=2", "train.num_workers=3")) == 2


def test_unknown_instance_type_is_a_config_error():
    with pytest.raises(ConfigError, match=r"cluster\.instance_type"):
        config(["cluster.instance_type=p9.huge"])


def test_entrypoint_passes_parameters_through_the_environment():
    line, env = entrypoint(["python", "--base-model={{workflow.parameters.base_model}}", "--x=a b;rm -rf /"])
    assert "{{" not in line
    assert env == [{"name": "EKSFLOW_PARAM_BASE_MODEL", "value": "{{workflow.parameters.base_model}}"}]
    assert shlex.split(line) == ["python", "--base-model=${EKSFLOW_PARAM_BASE_MODEL}", "--x=a b;rm -rf /"]


@pytest.mark.parametrize(
    ("cron", "timezone", "expected"),
    [
        ("0 3 * *", None, "--cron '0 3 * *': expected 5 fields"),
        ("0 3 * * funday", None, "day of week 'funday'"),
        (None, None, "needs a schedule"),
        ("0 3 * * 1", "Mars/Olympus", "not an IANA time zone"),
    ],
)
def test_bad_schedules_are_config_errors(cron, timezone, expected):
    with pytest.raises(ConfigError, match=re.escape(expected)):
        check_schedule(cron, timezone)


def test_good_schedules_pass():
    for cron in ("0 3 * * 1", "*/15 * * * *", "0 0 1,15 * MON-FRI", "@daily"):
        check_schedule(cron, "Europe/Paris")


@pytest.mark.parametrize(
    ("overrides", "strategy"),
    [
        ([], "ddp"),
        (["train.strategy=deepspeed", "train.zero_stage=3"], "deepspeed ZeRO-3"),
        (["cluster.instance_type=g5.12xlarge", "train.strategy=deepspeed", "train.cpu_offload=true"], "deepspeed"),
        (["cluster.instance_type=g5.12xlarge", "base_model=llama-3-8b"], "fsdp (auto"),
    ],
    ids=["cpu", "cpu-zero3", "gpu-zero2-offload", "gpu-auto-fsdp"],
)
def test_plan_and_the_train_step_resolve_with_one_memory_model(monkeypatch, overrides, strategy):
    """`plan` calls the step's own TrainSettings.resolve_strategy (eksflow.llm.steps.common.strategies' memory model):
    the strategy and memory it prints are what the step computes from the same parameter counts."""
    from eksflow.llm.steps.train import TrainSettings

    calls = []
    original = TrainSettings.resolve_strategy

    def spy(self, **kw):
        calls.append((self, kw))
        return original(self, **kw)

    monkeypatch.setattr(TrainSettings, "resolve_strategy", spy)
    rows = dict(plan.check(pipeline(overrides)).rows)
    settings, kw = calls[-1]
    assert rows["train: strategy"].startswith(strategy)
    step_side = original(settings, **kw)  # what the step resolves for a model with these counts on these devices
    assert rows["train: memory per worker"].startswith(f"~{step_side.memory_bytes / 1024**3:.1f} GiB")
    assert step_side.strategy in rows["train: strategy"]


def test_a_counted_model_and_plans_estimate_of_it_agree():
    """The step counts the loaded model's parameters, `plan` estimates them from the size: same strategy, and
    memory within 5% (the adapter's size is the only estimate) for the demo model's shape."""
    import torch
    from peft import get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    from eksflow.llm.steps.train.parallel import plan_strategy
    from eksflow.llm.steps.train.sizing import memory_plan

    cfg = config(["train.strategy=deepspeed", "train.zero_stage=3", "train.lora.rank=8"])
    shape = LlamaConfig(vocab_size=4096, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                        num_attention_heads=4, num_key_value_heads=2)  # fmt: skip
    model = get_peft_model(LlamaForCausalLM(shape), cfg.train.lora.peft_config())
    counted = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    step_side = plan_strategy(cfg.train, torch.device("cpu"), cfg.train.num_workers, counted, trainable)
    (job,) = pipeline(["train.strategy=deepspeed", "train.zero_stage=3", "train.lora.rank=8"]).jobs
    _, plan_side = memory_plan(job.settings, plan.layout_of(job, cfg), counted / 1e9)
    assert (step_side.strategy, step_side.zero_stage) == (plan_side.strategy, plan_side.zero_stage) == ("deepspeed", 3)
    assert abs(plan_side.memory_bytes / step_side.memory_bytes - 1) < 0.05


def test_a_model_too_big_for_one_gpu_plans_fsdp_over_all_workers():
    big = ["base_model=llama-3-70b", "cluster.instance_type=p4d.24xlarge", "cluster.zone=us-west-2a"]
    big += ["train.gradient_checkpointing=true", "cluster.nodes=2"]
    rows = dict(plan.check(pipeline(big)).rows)
    assert rows["train: strategy"].startswith("fsdp (auto")
    assert problems(*big, "train.strategy=ddp")[0].startswith("train.micro_batch_size:")  # a replica per GPU: no


def test_small_models_keep_ddp():
    assert dict(plan.check(pipeline(["cluster.instance_type=g5.12xlarge"])).rows)["train: strategy"] == "ddp"


def test_the_mpijob_launcher_is_planned_for_gpu_and_refused_for_trainium():
    rows = dict(plan.check(pipeline(["cluster.instance_type=p4d.24xlarge", "cluster.launcher=mpijob"])).rows)
    assert rows["train: pods"] == "1 MPI launcher + 1 worker pod(s) x 8 slot(s): mpirun -np 8"
    (line,) = problems("cluster.instance_type=trn1.32xlarge", "cluster.launcher=mpijob")
    assert line.startswith("cluster.launcher:") and "--set cluster.launcher=rayjob" in line


FLAGSHIP, SWEEP = "pipelines/llama_lora.py", "pipelines/lora_sweep.py"


@pytest.mark.parametrize(
    ("file", "args", "line"),
    [
        (
            FLAGSHIP,
            ["plan", "--set", "train.lora.rank=64"],
            "config error: train.lora.rank: rank 64 is above serving.engine.max_lora_rank (16), so vLLM could not "
            "load the trained adapter; train at rank 16 or less, or raise serving.engine.max_lora_rank to 64 (got "
            "64); fix it with --set train.lora.rank=<value> or in the --config file",
        ),
        (
            FLAGSHIP,
            ["render", "--set", "train.lora.rank=20"],  # the smallest rank vLLM takes that holds 20 is 32
            "config error: train.lora.rank: rank 20 is above serving.engine.max_lora_rank (16), so vLLM could not "
            "load the trained adapter; train at rank 16 or less, or raise serving.engine.max_lora_rank to 32 (got "
            "20); fix it with --set train.lora.rank=<value> or in the --config file",
        ),
        (
            SWEEP,
            ["plan", "--set", "sweep.ranks=[8,32,16]"],
            "config error: sweep.ranks: rank 32 is above the default serving engine's max_lora_rank (16), so vLLM "
            "could not load the trained adapter; train at rank 16 or less (got (8, 32, 16)); fix it with --set "
            "sweep.ranks=<value> or in the --config file",
        ),
    ],
    ids=["flagship-plan", "flagship-render", "sweep-grid"],
)
def test_a_lora_rank_serving_cannot_load_is_refused_in_one_line(file, args, line):
    """Not after training, when load-candidate finds the adapter's rank: wherever the config is loaded."""
    result = python(file, *args)
    assert (result.returncode, result.stderr.strip().splitlines(), result.stdout) == (2, [line], "")


@pytest.mark.parametrize(
    ("module", "settings"),
    [
        (llama_lora, {"train": {"lora": {"rank": 16}}}),
        (llama_lora, {"train": {"lora": {"rank": 64}}, "serving": {"engine": {"max_lora_rank": 64}}}),
        (lora_sweep, {"sweep": {"ranks": [4, 16]}}),
    ],
    ids=["flagship-at-the-limit", "flagship-limit-raised", "sweep-at-the-limit"],
)
def test_a_lora_rank_at_the_engine_limit_is_planned(tmp_path, module, settings):
    (tmp_path / "ranks.yaml").write_text(yaml.safe_dump(settings))
    built = module.build(load_config(config_type(module.build), tmp_path / "ranks.yaml"))
    assert dict(plan.check(built).rows)["train: cost per hour"].startswith("$")


def test_a_users_own_serving_pipeline_gets_the_rank_rule_for_its_own_sections(tmp_path):
    """Every LoraSettings section of a ServingConfig is held to the engine, whatever the pipeline names it."""

    class Text2Sql(ServingConfig):
        finetune: TrainSettings = TrainSettings()
        refine: TrainSettings = TrainSettings()

    with pytest.raises(ConfigError) as err:
        load_config(Text2Sql, None, ["finetune.lora.rank=32", "refine.lora.rank=128"])
    keys = [line.split(":")[0] for line in str(err.value).splitlines()]
    assert keys == ["finetune.lora.rank", "refine.lora.rank"]
    (tmp_path / "raised.yaml").write_text(yaml.safe_dump({"serving": {"engine": {"max_lora_rank": 32}}}))
    assert load_config(Text2Sql, tmp_path / "raised.yaml", ["finetune.lora.rank=32"]).finetune.lora.rank == 32
