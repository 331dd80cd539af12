"""Every variant and kind validates against the official schemas; embedded jobs against their CRDs (strict)."""

import re
import shlex
from pathlib import Path

import pytest
import yaml

from eksflow.cli import apply_variant
from eksflow.launchers import rayjob
from eksflow.profiles import POD_INTERFACE
from eksflow.render import cron_workflow, workflow_template
from tests.argo_substitution import manifest_object, resource_objects
from tests.flagship import config, rendered

ROOT = Path(__file__).resolve().parents[2]
VARIANTS = {
    "cpu": [],
    "cpu-rayjob-2-nodes": ["cluster.nodes=2"],  # several CPU nodes: a RayJob, one training worker per node
    "gpu-kueue": ["cluster.instance_type=g5.12xlarge"],
    "gpu-volcano": ["cluster.instance_type=g5.12xlarge", "cluster.scheduler=volcano"],
    # QLoRA on every linear layer: the RayJob's train step gets the 4-bit base in its --lora
    "gpu-qlora": [
        "cluster.instance_type=g5.12xlarge",
        "train.lora.quantize=4bit",
        "train.lora.target_modules=all-linear",
    ],
    "p4d-efa-spot": [
        "cluster.instance_type=p4d.24xlarge",
        "cluster.nodes=2",
        "cluster.zone=us-west-2a",
        "cluster.spot=true",
    ],
    "p5": ["cluster.instance_type=p5.48xlarge"],
    "trainium": ["cluster.instance_type=trn1.32xlarge", "cluster.nodes=2"],
    "gpu-mpijob": ["cluster.instance_type=g5.12xlarge", "cluster.launcher=mpijob", "train.strategy=deepspeed"],
    "p4d-efa-spot-mpijob-volcano": [
        "cluster.instance_type=p4d.24xlarge",
        "cluster.nodes=2",
        "cluster.zone=us-west-2a",
        "cluster.spot=true",
        "cluster.scheduler=volcano",
        "cluster.launcher=mpijob",
    ],
    "cpu-mpijob": ["cluster.launcher=mpijob", "train.strategy=deepspeed", "train.zero_stage=3"],
    "cpu-mpijob-2-nodes": ["cluster.launcher=mpijob", "cluster.nodes=2", "train.strategy=deepspeed"],
    "p4d-slurm": [
        "cluster.instance_type=p4d.24xlarge",
        "cluster.nodes=2",
        "cluster.zone=us-west-2a",
        "cluster.launcher=slurm",
        "cluster.slurm.partition=gpu",
        "cluster.slurm.time_limit_min=600",
    ],
    "cpu-slurm": ["cluster.launcher=slurm"],
    "cpu-slurm-2-nodes": ["cluster.launcher=slurm", "cluster.nodes=2"],  # one srun task per node
    "cpu-trainjob": ["cluster.launcher=trainjob"],
    "cpu-trainjob-2-nodes-volcano": ["cluster.launcher=trainjob", "cluster.nodes=2", "cluster.scheduler=volcano"],
    "p4d-efa-spot-trainjob-rack": [
        "cluster.instance_type=p4d.24xlarge",
        "cluster.nodes=2",
        "cluster.zone=us-west-2a",
        "cluster.spot=true",
        "cluster.launcher=trainjob",
        "cluster.topology=rack",
    ],
    "gpu-rayjob-block-preferred": [
        "cluster.instance_type=g5.12xlarge",
        "cluster.topology=block",
        "cluster.topology_mode=preferred",
    ],
    "gpu-mpijob-host": ["cluster.instance_type=g5.12xlarge", "cluster.launcher=mpijob", "cluster.topology=host"],
}


def render(overrides):
    return rendered(overrides)


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def variant(request):
    return request.param, render(VARIANTS[request.param])


def errors(validator, document):
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(document)]


CORE_API_VERSIONS = ("v1", "apps/v1", "policy/v1", "networking.k8s.io/v1")  # the fleet: tests/contract/test_serving.py


def resources(workflow):
    """(template name, parsed manifest) of every resource template."""
    return list(resource_objects(workflow).items())


def embedded(workflow):
    """(template name, parsed manifest) of every resource template creating a custom resource (a training job)."""
    return [(name, obj) for name, obj in resources(workflow) if obj["apiVersion"] not in CORE_API_VERSIONS]


def test_every_kind_of_every_variant_validates(variant, argo_validator):
    _, workflow = variant
    assert errors(argo_validator("Workflow"), workflow) == []
    assert errors(argo_validator("WorkflowTemplate"), workflow_template(workflow)) == []
    assert errors(argo_validator("CronWorkflow"), cron_workflow(workflow, "0 3 * * 1", "Europe/Paris")) == []


def test_a_slurm_job_on_several_cpu_nodes_runs_one_rank_per_node_with_gloo_on_the_pods_eth0():
    def train(variant: str) -> dict:
        (template,) = [t for t in render(VARIANTS[variant])["spec"]["templates"] if t["name"] == "train"]
        return template["container"]

    one, several = train("cpu-slurm"), train("cpu-slurm-2-nodes")
    args = several["args"]
    own, step = args[: args.index("--")], args[args.index("--") + 1 :]
    assert {"--nodes=2", "--tasks-per-node=1", "--gpus-per-node=0"} <= set(own)
    assert "--num-workers=2" in step  # the step's own count agrees with srun's
    assert {"--nodes=1", "--tasks-per-node=2"} <= set(one["args"])  # one node: every rank on it
    env = {e["name"]: e["value"] for e in several["env"]}
    assert env["GLOO_SOCKET_IFNAME"] == POD_INTERFACE == "eth0"  # forwarded to the srun tasks
    assert "GLOO_SOCKET_IFNAME" not in {e["name"] for e in one["env"]}


def test_embedded_jobs_validate_against_their_crds(variant, crd_validator):
    name, workflow = variant
    objects = embedded(workflow)
    assert bool(objects) == (name != "cpu" and "slurm" not in name)  # a Slurm job is slurmrestd's, not an object
    for _, obj in objects:
        assert errors(crd_validator(obj), obj) == []


def test_the_gpu_profile_renders_qlora_into_the_train_steps_argv():
    """train.lora.quantize=4bit reaches the RayJob's train step as its --lora, which the step's Args parse."""
    from eksflow.llm.steps.train import LoraSettings

    ((_, job),) = embedded(render(VARIANTS["gpu-qlora"]))
    (lora,) = [a for a in shlex.split(job["spec"]["entrypoint"]) if a.startswith("--lora=")]
    parsed = LoraSettings.model_validate_json(lora.removeprefix("--lora="))
    assert (parsed.quantize, parsed.target_modules, job["kind"]) == ("4bit", "all-linear", "RayJob")


def test_a_misspelled_rayjob_field_is_rejected(crd_validator):
    (_, job), *_ = embedded(render(VARIANTS["gpu-kueue"]))
    job["spec"]["entryPoint"] = job["spec"].pop("entrypoint")
    assert any("entryPoint" in e for e in errors(crd_validator(job), job))


def test_rayjob_follows_kueue_and_its_status():
    workflow = render(VARIANTS["gpu-kueue"])
    (train,) = [t for t in workflow["spec"]["templates"] if t["name"] == "train"]
    assert train["resource"]["successCondition"] == rayjob.SUCCESS
    assert train["resource"]["failureCondition"] == rayjob.FAILURE
    assert train["resource"]["setOwnerReference"] is True
    job = manifest_object(train)
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "eksflow"
    assert job["spec"]["suspend"] is True
    assert job["spec"]["shutdownAfterJobFinishes"] is True and job["spec"]["ttlSecondsAfterFinished"] == 600
    (workers,) = job["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    assert workers["replicas"] == workers["minReplicas"] == workers["maxReplicas"] == 1
    limits = workers["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == "4"
    argv = shlex.split(job["spec"]["entrypoint"])
    assert argv[:3] == ["python", "-m", "eksflow.llm.steps.train"]
    assert "--num-workers=4" in argv and "--use-gpu=true" in argv
    assert "--outputs-dir=/fsx/runs/{{workflow.name}}/train/outputs" in argv


def test_volcano_gang_covers_every_pod():
    objects = dict(embedded(render(VARIANTS["gpu-volcano"])))
    assert objects["train-podgroup"]["spec"]["minMember"] == 2  # head + 1 worker
    job = objects["train"]
    assert "suspend" not in job["spec"]
    for group in [job["spec"]["rayClusterSpec"]["headGroupSpec"], *job["spec"]["rayClusterSpec"]["workerGroupSpecs"]]:
        pod = group["template"]
        assert pod["spec"]["schedulerName"] == "volcano"
        assert pod["metadata"]["annotations"]["scheduling.k8s.io/group-name"] == "{{workflow.name}}-train-pg"


def test_efa_pods_are_wired_for_efa_in_one_zone():
    (_, job), *_ = embedded(render(VARIANTS["p4d-efa-spot"]))
    pod = job["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]
    spec = pod["spec"]
    assert pod["metadata"]["annotations"]["karpenter.sh/do-not-disrupt"] == "true"
    assert spec["nodeSelector"] == {
        "node.kubernetes.io/instance-type": "p4d.24xlarge",
        "karpenter.sh/capacity-type": "spot",
        "topology.kubernetes.io/zone": "us-west-2a",
    }
    (container,) = spec["containers"]
    assert container["resources"]["limits"]["vpc.amazonaws.com/efa"] == "4"
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["FI_PROVIDER"] == "efa" and env["FI_EFA_USE_DEVICE_RDMA"] == "1" and env["RDMAV_FORK_SAFE"] == "1"
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["IPC_LOCK"]}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert mounts == {"/fsx": "fsx", "/dev/shm": "dshm"}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["dshm"]["emptyDir"]["medium"] == "Memory"
    assert volumes["fsx"]["persistentVolumeClaim"]["claimName"] == "fsx-claim"
    assert spec["serviceAccountName"] == "eksflow-pipeline"


def test_trainium_runs_torchrun_on_every_neuron_core():
    (_, job), *_ = embedded(render(VARIANTS["trainium"]))
    assert job["spec"]["minAvailable"] == 2 and job["spec"]["schedulerName"] == "volcano"
    (task,) = job["spec"]["tasks"]
    (container,) = task["template"]["spec"]["containers"]
    assert "--nproc_per_node=32" in container["command"] and "--nnodes=2" in container["command"]
    assert container["resources"]["limits"]["aws.amazon.com/neuron"] == "16"
    assert "--num-workers=64" in container["command"]


def test_train_outputs_reach_evaluate_on_the_cluster_variants():
    workflow = render(VARIANTS["gpu-kueue"])
    (dag,) = [t["dag"]["tasks"] for t in workflow["spec"]["templates"] if t["name"] == workflow["spec"]["entrypoint"]]
    tasks = {t["name"]: t for t in dag}
    assert tasks["train"]["depends"] == "stage-data.Succeeded && validate-data.Succeeded"
    assert tasks["train"]["when"] == "{{tasks.stage-data.outputs.parameters.changed}} == true"
    assert tasks["train-outputs"]["depends"] == "stage-data.Succeeded && train.Succeeded"  # a skipped job skips it
    assert tasks["evaluate"]["depends"] == "stage-data.Succeeded && train-outputs.Succeeded && champion.Succeeded"
    evaluate_args = {p["name"]: p["value"] for p in tasks["evaluate"]["arguments"]["parameters"]}
    assert evaluate_args["adapter_dir"] == "{{tasks.train-outputs.outputs.parameters.adapter_dir}}"
    (collector,) = [t for t in workflow["spec"]["templates"] if t["name"] == "train-outputs"]
    paths = [p["valueFrom"]["path"] for p in collector["outputs"]["parameters"]]
    assert collector["container"]["command"] == ["cat", *paths]
    assert all(p.startswith("/fsx/runs/{{workflow.name}}/train/outputs/") for p in paths)


SHELL_PARAMETER = re.compile(r"\{\{\s*(inputs|tasks|steps|workflow\.parameters)\.")


def pod_specs(workflow):
    """(where, pod-level dict, container) for every container Argo or an embedded job would start."""
    for t in workflow["spec"]["templates"]:
        if "container" in t:
            yield t["name"], t, t["container"]
    for name, obj in embedded(workflow):
        spec = obj["spec"]
        groups = []
        if obj["kind"] == "RayJob":
            cluster = spec["rayClusterSpec"]
            groups = [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]
        elif obj["kind"] == "Job":
            groups = spec["tasks"]
        elif obj["kind"] == "MPIJob":
            groups = list(spec["mpiReplicaSpecs"].values())
        elif obj["kind"] == "TrainJob":
            groups = [{"template": trainjob_pod(obj)}]
        for group in groups:
            for container in group["template"]["spec"]["containers"]:
                yield f"{name}/{container['name']}", group["template"]["spec"], container
    for name, obj in resources(workflow):
        groups = [obj["spec"]] if obj["kind"] == "Deployment" else []  # the serving fleet's pods
        for group in groups:
            for container in group["template"]["spec"]["containers"]:
                yield f"{name}/{container['name']}", group["template"]["spec"], container


def trainjob_pod(job):
    """The pod template a TrainJob's `node` pods get: the runtime patch's, with `spec.trainer`'s container fields."""
    (patch,) = job["spec"]["runtimePatches"]
    (node,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    template = node["template"]["spec"]["template"]
    trainer = job["spec"]["trainer"]
    (container,) = template["spec"]["containers"]
    merged = {**container, "image": trainer["image"], "resources": trainer["resourcesPerNode"], "env": trainer["env"]}
    return {"metadata": template["metadata"], "spec": {**template["spec"], "containers": [merged]}}


def test_lint_every_rendered_manifest(variant):
    """S2: no parameter in a shell string, no :latest, restricted security context, resources set."""
    _, workflow = variant
    for _, obj in embedded(workflow):
        if obj["kind"] == "RayJob":
            assert not SHELL_PARAMETER.search(obj["spec"]["entrypoint"]), obj["spec"]["entrypoint"]
    for where, pod, container in pod_specs(workflow):
        assert "script" not in pod
        image = container.get("image", "")
        assert image and not image.endswith(":latest") and ":" in image.rsplit("/", 1)[-1], where
        assert container["resources"].get("requests") or container["resources"].get("limits"), where
        security = container["securityContext"]
        assert security["allowPrivilegeEscalation"] is False and security["runAsNonRoot"] is True, where
        assert security["capabilities"]["drop"] == ["ALL"], where
        assert security["capabilities"].get("add", ["IPC_LOCK"]) == ["IPC_LOCK"], where  # EFA only: pinned memory
        for var in container.get("env", []):
            assert not re.search(r"(?i)(secret|token|password)", var["name"]), where


def test_apply_variant_keeps_a_configured_instance_of_that_kind():
    cfg = config(["cluster.instance_type=p5.48xlarge"])
    assert apply_variant(cfg, "gpu").cluster.instance_type == "p5.48xlarge"
    assert apply_variant(cfg, "trainium").cluster.instance_type == "trn1.32xlarge"
    assert apply_variant(cfg, "cpu").cluster.instance_type == "m6i.4xlarge"


def test_committed_cron_matches_a_fresh_render():
    committed = ROOT / "workflow-templates" / "llama-lora-cron.yaml"
    assert committed.is_file(), "run `make templates` and commit workflow-templates/"
    documents = list(yaml.safe_load_all(committed.read_text()))
    workflow = render([])
    scheduled = {"retrain": "if-data-changed"}
    assert documents == [workflow_template(workflow), cron_workflow(workflow, "0 3 * * 1", "UTC", scheduled)], (
        "workflow-templates/ is stale: run `make templates`"
    )
    cron = documents[1]["spec"]
    assert cron["concurrencyPolicy"] == "Forbid" and cron["schedules"] == ["0 3 * * 1"]
    # scheduled runs train only on new data; the template's own default (manual submits) trains every time
    assert cron["workflowSpec"]["arguments"]["parameters"] == [{"name": "retrain", "value": "if-data-changed"}]
    defaults = {p["name"]: p["value"] for p in documents[0]["spec"]["arguments"]["parameters"]}
    assert defaults["retrain"] == "always"


def test_prometheus_gauges_on_train_and_evaluate(variant):
    _, workflow = variant
    names = {
        t["name"]: [p["name"] for p in t.get("metrics", {}).get("prometheus", [])]
        for t in workflow["spec"]["templates"]
    }
    assert names["evaluate"] == ["eksflow_evaluate_exact_match"]
    holder = "train-outputs" if "train-outputs" in names else "train"
    assert names[holder] == ["eksflow_train_final_loss", "eksflow_train_tokens_per_s"]


def test_cpu_train_pod_is_placed_by_its_profile_and_still_runs_locally():
    from eksflow.local.manifest import parse_manifest
    from eksflow.local.model import ContainerTemplate

    workflow = render([])
    (train,) = [t for t in workflow["spec"]["templates"] if t["name"] == "train"]
    assert train["metadata"]["annotations"]["karpenter.sh/do-not-disrupt"] == "true"
    assert train["nodeSelector"]["node.kubernetes.io/instance-type"] == "m6i.4xlarge"
    train_template = parse_manifest(workflow).templates["train"]
    assert isinstance(train_template, ContainerTemplate)
    assert train_template.command == ("python", "-m", "eksflow.llm.steps.train")


def test_the_slurm_task_submits_the_train_step_with_the_token_from_its_secret():
    workflow = render(VARIANTS["p4d-slurm"])
    (template,) = [t for t in workflow["spec"]["templates"] if t["name"] == "train"]
    container = template["container"]
    assert container["command"] == ["python", "-m", "eksflow.runtime.slurm_job"]
    args = container["args"]
    own, step = args[: args.index("--")], args[args.index("--") + 1 :]
    assert {"--nodes=2", "--tasks-per-node=8", "--gpus-per-node=8", "--partition=gpu", "--time-limit-min=600",
            "--api-version=v0.0.44", "--token-file=/etc/eksflow/slurm/token"} <= set(own)  # fmt: skip
    assert "--job-name={{workflow.name}}-train" in own
    assert step[0] == "eksflow.llm.steps.train" and step[-1] == "--launcher=mpi"
    assert not [a for a in args if "token=" in a.lower() and "token-file" not in a]  # never the token itself
    (volume,) = template["volumes"]
    assert volume["secret"]["secretName"] == "eksflow-slurm"
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["FI_PROVIDER"] == "efa" and env["NCCL_PROTO"] == "simple"  # forwarded to the srun tasks
    assert template["retryStrategy"]["limit"] == "1"
    assert {o["name"] for o in template["outputs"]["parameters"]} >= {"adapter_dir", "final_loss"}
