"""The launcher registry is the one place a distributed step's launcher is picked; a new launcher is one module."""

import re
from pathlib import Path

import pytest

from eksflow import ClusterSettings, Pipeline, PipelineConfig, distributed, plan, profiles
from eksflow.cluster import LAUNCHERS, cluster_of
from eksflow.errors import ConfigError, PipelineError
from eksflow.launchers import mpijob, slurm, trainjob
from eksflow.launchers.base import Job, JobRequest, Launcher, named, refusal, register, select
from eksflow.launchers.container import ContainerTask
from eksflow.launchers.mpijob import MpiJob
from eksflow.launchers.rayjob import RayJob
from eksflow.launchers.slurm import SlurmLauncher
from eksflow.launchers.trainjob import TrainJob
from eksflow.launchers.volcano import VolcanoJob
from eksflow.render import manifest
from eksflow.templates import task
from pipelines.llama_lora import build
from tests.flagship import config
from tests.unit.test_pipeline import MakeArgs, MakeOutputs, step

SDK = Path(__file__).resolve().parents[3] / "eksflow"
INSTANCES = {"cpu": "m6i.4xlarge", "gpu": "g5.12xlarge", "trainium": "trn1.32xlarge"}


class Tiny(Launcher):
    """A launcher as a later issue would add one: the step as a labelled container task."""

    name = "tiny"
    kinds = frozenset({"cpu"})

    def pods(self, cfg, job):
        return "1 tiny pod"

    def attempts(self, cfg, job):
        return 1

    def add(self, request: JobRequest):
        return task(
            request.step,
            request.settings,
            *request.sections,
            task_name=request.task,
            after=request.after,
            when=request.when,
            memoize=request.memoize,
            labels={"eksflow.dev/launcher": self.name},
            **request.values,
        )


@pytest.fixture
def tiny():
    """Registers Tiny for one test; no other test sees it."""
    yield register(Tiny())
    del LAUNCHERS["tiny"]


def configured(launcher, overrides=()):
    """The flagship config with `cluster.launcher` set to any name (the config's check bypassed: `select` sees it)."""
    cfg = config(list(overrides))
    return cfg.model_copy(update={"cluster": cluster_of(cfg).model_copy(update={"launcher": launcher})})


@pytest.mark.parametrize(
    ("kind", "launcher", "expected"),
    [
        ("cpu", "rayjob", ContainerTask),
        ("cpu", "mpijob", MpiJob),
        ("gpu", "rayjob", RayJob),
        ("gpu", "mpijob", MpiJob),
        ("trainium", "rayjob", VolcanoJob),
        ("trainium", "mpijob", VolcanoJob),  # refused by `plan`, rendered as Trainium's own
        ("cpu", "slurm", SlurmLauncher),
        ("gpu", "slurm", SlurmLauncher),
        ("trainium", "slurm", VolcanoJob),  # refused by `plan`, rendered as Trainium's own
        ("cpu", "trainjob", TrainJob),
        ("gpu", "trainjob", TrainJob),
        ("trainium", "trainjob", VolcanoJob),  # refused by `plan`, rendered as Trainium's own
    ],
)
def test_each_profile_kind_and_configured_launcher_select_one_launcher(kind, launcher, expected):
    overrides = [f"cluster.instance_type={INSTANCES[kind]}", f"cluster.launcher={launcher}"]
    cluster = cluster_of(config(overrides))
    profile = profiles.profile_for(cluster.instance_type)
    assert type(select(cluster, profile)) is expected
    refused = {
        ("trainium", "mpijob"): mpijob.TRAINIUM_REFUSAL,
        ("trainium", "slurm"): slurm.REFUSAL,
        ("trainium", "trainjob"): trainjob.TRAINIUM_REFUSAL,
    }.get((kind, launcher))
    assert refusal(cluster, profile) == refused
    (job,) = build(config(overrides)).jobs
    assert type(job.launcher) is expected


def test_an_unknown_launcher_is_refused_naming_the_field_and_the_registered_ones():
    cluster = cluster_of(configured("pbs"))
    with pytest.raises(PipelineError) as err:
        select(cluster, profiles.profile_for(cluster.instance_type))
    assert str(err.value) == (
        "cluster.launcher: no launcher 'pbs'; registered: container, mpijob, rayjob, slurm, trainjob, volcano; fix: "
        "--set "
        "cluster.launcher=<one of them>, or import the module registering it before building the pipeline"
    )


def test_two_launchers_cannot_share_a_name():
    class Impostor(Tiny):
        name = "rayjob"

    with pytest.raises(PipelineError, match=r"launcher 'rayjob': .* registers it again .*fix: give one"):
        register(Impostor())
    assert type(named("rayjob")) is RayJob


def test_a_registered_launcher_runs_the_step_and_plan_shows_it(tiny):
    pipeline = build(configured("tiny"))
    (job,) = pipeline.jobs
    assert isinstance(job, Job) and job.launcher is tiny
    templates = {t["name"]: t for t in manifest(pipeline)["spec"]["templates"]}
    assert templates["train"]["metadata"]["labels"] == {"eksflow.dev/launcher": "tiny"}
    assert "train-outputs" not in templates  # its task holds the outputs: downstream tasks read it directly
    rows = dict(plan.check(pipeline).rows)
    assert rows["train: pods"] == "1 tiny pod"
    assert rows["train: attempts"].startswith("1 at most")


def test_a_launcher_that_does_not_run_on_the_kind_gives_way_to_the_kinds_own(tiny):
    (job,) = build(configured("tiny", ["cluster.instance_type=g5.12xlarge"])).jobs
    assert type(job.launcher) is RayJob


class LayoutArgs(MakeArgs):
    num_workers: int = 1
    cpus_per_worker: int = 1
    use_gpu: bool = False


class TrainingConfig(PipelineConfig):
    cluster: ClusterSettings = ClusterSettings()


@pytest.mark.parametrize(
    ("cluster", "message"),
    [
        ({"launcher": "mpijob"}, r"cluster\.launcher=mpijob .* no `launcher` field; fix: give its Args"),
        ({"launcher": "trainjob"}, r"cluster\.launcher=trainjob .* no `launcher` field; fix: give its Args"),
        ({"instance_type": "trn1.32xlarge"}, r"no neuron_step= for Trainium \(trn1\.32xlarge\); fix: pass"),
    ],
    ids=["mpijob-without-launcher-field", "trainjob-without-launcher-field", "trainium-without-neuron-step"],
)
def test_a_launcher_refuses_a_step_it_cannot_run_before_any_task_is_added(cluster, message):
    cfg = TrainingConfig(cluster=ClusterSettings(**cluster))
    with Pipeline(cfg, title="test") as pipeline, pytest.raises(PipelineError, match=message):
        distributed(step("layout", LayoutArgs, MakeOutputs), LayoutArgs(out_dir="/fsx/out"))
    assert pipeline.jobs == [] and pipeline.templates == {}


def test_eksflow_s_train_step_on_trainium_without_neuron_step_names_its_neuron_module():
    """The fix names the module to pass (issue 55: the line said only `neuron_step=`)."""
    from eksflow.llm.steps import train
    from eksflow.llm.steps.train import TrainSettings

    cfg = TrainingConfig(cluster=ClusterSettings(instance_type="trn1.32xlarge"))
    with Pipeline(cfg, title="test"), pytest.raises(PipelineError) as refused:
        distributed(train, TrainSettings(), dataset_dir="/fsx/data", output_dir="/fsx/out", base_model="m")
    assert str(refused.value).endswith(
        "pass the step's Neuron variant as neuron_step=train_neuron (the module eksflow.llm.steps.train_neuron: "
        "`from eksflow.llm.steps import train_neuron`)"
    )


def test_no_module_but_the_registry_branches_on_a_launcher_name():
    compared = re.compile(r"\blauncher\s*(==|!=|\bin\b|\bnot in\b)")
    found = [
        f"{path.relative_to(SDK)}:{number}"
        for path in SDK.rglob("*.py")
        if not path.is_relative_to(SDK / "llm" / "steps")  # the train step reads its own `launcher` argument
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if compared.search(line)
    ]
    assert found == []


@pytest.mark.parametrize(
    ("overrides", "job_kind"),
    [
        (["cluster.launcher=rayjob"], None),  # one CPU node: a plain pod
        (["cluster.launcher=rayjob", "cluster.nodes=2"], "RayJob"),
    ],
    ids=["container", "rayjob"],
)
def test_the_train_task_has_a_deadline_of_its_own_from_the_expected_hours_locally_too(overrides, job_kind):
    """A partitioned node once held a RayJob until the workflow's 23 h deadline: each training attempt is stopped after
    three times cluster.expected_hours, its job first (it says why), and `run` stops it there too."""
    from eksflow.launchers.jobs import DEADLINE_MARGIN_S
    from eksflow.local.manifest import parse_manifest

    rendered = manifest(build(config([*overrides, "cluster.expected_hours=0.5"])))
    templates = {t["name"]: t for t in rendered["spec"]["templates"]}
    train = templates["train"]
    if job_kind is None:
        assert train["activeDeadlineSeconds"] == 3 * 1800
    else:
        job = train["resource"]["manifest"]  # text holding Argo expressions: read line by line
        assert f"kind: {job_kind}" in job and re.findall(r"activeDeadlineSeconds: (\d+)", job) == [str(3 * 1800)]
        assert train["activeDeadlineSeconds"] == 3 * 1800 + DEADLINE_MARGIN_S  # Argo waits for the job a little longer
    assert parse_manifest(rendered).templates["train"].deadline_s == train["activeDeadlineSeconds"]  # `run` stops it
    assert rendered["spec"]["activeDeadlineSeconds"] > train["activeDeadlineSeconds"]
    # an MPIJob's own deadline likewise, within 95% of the workflow's
    cfg = config(["cluster.expected_hours=0.5", "active_deadline_seconds=3600"])
    assert mpijob.manifest(cfg, "train", "eksflow.llm.steps.train", 2, [])["spec"]["runPolicy"][
        "activeDeadlineSeconds"
    ] == int(3600 * 0.95)


@pytest.mark.parametrize(
    ("overrides", "launcher"),
    [
        ([], "container"),  # one CPU node: a plain pod
        (["cluster.launcher=slurm"], "slurm"),
        (["cluster.instance_type=trn1.32xlarge", "cluster.nodes=2"], "volcano"),
    ],
)
def test_a_topology_on_a_launcher_whose_pods_kueue_does_not_place_is_refused_in_one_line(overrides, launcher):
    with pytest.raises(ConfigError) as refused:
        build(config([*overrides, "cluster.topology=rack"]))
    (line,) = str(refused.value).splitlines()
    assert line.startswith("cluster.topology: rack keeps a job's pods in one network domain")
    assert f"the {launcher} launcher's job" in line and line.endswith("or --set cluster.topology=none")


def test_a_topology_under_volcano_is_refused_when_the_config_is_loaded():
    with pytest.raises(ConfigError) as refused:
        config(["cluster.instance_type=g5.12xlarge", "cluster.topology=block", "cluster.scheduler=volcano"])
    (line,) = str(refused.value).splitlines()
    assert line.startswith("cluster: topology: block places pods through Kueue's Topology Aware Scheduling")


def test_the_trainjob_passes_torchruns_argv_and_env_as_data():
    """A parameter in the step's argv is one whole YAML value (an expression tag), never spliced into text."""
    rendered = manifest(build(config(["cluster.instance_type=g5.12xlarge", "cluster.launcher=trainjob"])))
    (train,) = [t for t in rendered["spec"]["templates"] if t["name"] == "train"]
    text = train["resource"]["manifest"]
    assert '- {{=toJson("--base-model=" + workflow.parameters.base_model)}}' in [
        line.strip() for line in text.splitlines()
    ]
    assert not re.search(r"\{\{\s*(workflow\.parameters|inputs\.parameters)", text.replace("{{=", ""))
    assert "    command:\n    - torchrun\n    - -m\n    - eksflow.llm.steps.train\n" in text
