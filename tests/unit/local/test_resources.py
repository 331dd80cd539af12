"""Resource templates run locally: a RayJob's entrypoint as a process, PodGroups admitted, device requests checked."""

import io
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from rich.console import Console

from eksflow.llm.serving.local_fleet import FLEET_KINDS
from eksflow.local import LocalExecutorError, RunResult, run_workflow
from eksflow.local.manifest import parse_manifest
from eksflow.local.model import ContainerTemplate, ResourceTemplate
from eksflow.local.substitution import PLACEHOLDER
from eksflow.manifests import REFERENCE

ROOT = Path(__file__).resolve().parents[3]
FSX_VOLUME = {"name": "fsx", "persistentVolumeClaim": {"claimName": "fsx-claim"}}
FSX_MOUNT = {"name": "fsx", "mountPath": "/fsx"}
# Writes its argv[2] and where it ran into the folder argv[1]; a container task publishes the files.
WRITE_RESULTS = """
import os, pathlib, sys
out = pathlib.Path(sys.argv[1])
out.mkdir(parents=True)
(out / "greeting").write_text(sys.argv[2])
(out / "python").write_text(sys.executable)
(out / "where").write_text(str(out))
print("wrote", out)
"""
RESULTS = ("greeting", "python", "where")


def rayjob(
    entrypoint: str,
    *,
    env: dict[str, str] | None = None,
    worker_devices: dict[str, str] | None = None,
    head_devices: dict[str, str] | None = None,
    **spec: Any,
) -> str:
    """A RayJob manifest shaped like the one eksflow renders: FSx and /dev/shm on the head, one worker group."""
    head = {
        "name": "ray-head",
        "image": "ghcr.io/eksflow/train-gpu:0.1.0",
        "env": [{"name": k, "value": v} for k, v in (env or {}).items()],
        "resources": {"limits": {"memory": "16Gi", **(head_devices or {})}},
        "volumeMounts": [FSX_MOUNT, {"name": "dshm", "mountPath": "/dev/shm"}],
    }
    worker = {"name": "ray-worker", "image": "x", "resources": {"limits": {"cpu": "4", **(worker_devices or {})}}}
    volumes = [FSX_VOLUME, {"name": "dshm", "emptyDir": {"medium": "Memory"}}]
    manifest = {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": "{{workflow.name}}-train-{{retries}}"},
        "spec": {
            "entrypoint": entrypoint,
            "shutdownAfterJobFinishes": True,
            "backoffLimit": 1,
            "suspend": True,
            "rayClusterSpec": {
                "headGroupSpec": {
                    "rayStartParams": {"num-cpus": "0"},
                    "template": {"spec": {"containers": [head], "volumes": volumes}},
                },
                "workerGroupSpecs": [
                    {"groupName": "gpu", "replicas": 2, "template": {"spec": {"containers": [worker]}}},
                ],
            },
            **spec,
        },
    }
    return yaml.safe_dump(manifest, sort_keys=False)


def resource(name: str, manifest: str, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "resource": {
            "action": "create",
            "setOwnerReference": True,
            "successCondition": "status.jobDeploymentStatus == Complete",
            "failureCondition": "status.jobDeploymentStatus == Failed",
            "manifest": manifest,
        },
        **extra,
    }


def container(name: str, command: list[str], **extra: Any) -> dict[str, Any]:
    return {"name": name, "container": {"image": "x", "command": command, "volumeMounts": [FSX_MOUNT]}, **extra}


def workflow(tasks: list[tuple[str, str | None]], templates: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    """Tasks named after their templates, as (name, depends)."""
    dag = [{"name": n, "template": n, **({"depends": d} if d else {})} for n, d in tasks]
    return {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Workflow",
        "metadata": {"generateName": "test-"},
        "spec": {
            "entrypoint": "main",
            "volumes": [FSX_VOLUME],
            "templates": [*templates, {"name": "main", "dag": {"tasks": dag}}],
            **spec,
        },
    }


def run(manifest: dict[str, Any], tmp_path: Path, **kwargs: Any) -> RunResult:
    return run_workflow(manifest, tmp_path / "state", cwd=tmp_path, console=Console(file=io.StringIO()), **kwargs)


def phases(result: RunResult) -> dict[str, str]:
    return {name: node.phase for name, node in result.nodes.items()}


def test_rayjob_entrypoint_runs_here_and_a_container_publishes_its_files(tmp_path: Path) -> None:
    greeting = "hello $(touch CANARY) `touch CANARY` world"
    entrypoint = f'python -c {shlex.quote(WRITE_RESULTS)} /fsx/runs/{{{{workflow.name}}}}/out "${{EKSFLOW_PARAM_X}}"'
    files = [f"/fsx/runs/{{{{workflow.name}}}}/out/{name}" for name in RESULTS]
    manifest = workflow(
        [("train", None), ("collect", "train")],
        [
            resource("train", rayjob(entrypoint, env={"EKSFLOW_PARAM_X": "{{workflow.parameters.greeting}}"})),
            container(
                "collect",
                ["cat", *files],
                outputs={
                    "parameters": [{"name": n, "valueFrom": {"path": p}} for n, p in zip(RESULTS, files, strict=True)]
                },
            ),
        ],
        arguments={"parameters": [{"name": "greeting", "value": greeting}]},
    )
    result = run(manifest, tmp_path)
    assert phases(result) == {"train": "Succeeded", "collect": "Succeeded"}, result.message
    assert result.nodes["train"].exit_code == 0
    assert result.nodes["collect"].outputs == {
        "greeting": greeting,  # through the head's env, expanded once by the shell, never re-parsed
        "python": sys.executable,  # `python` in the entrypoint is the project's interpreter
        "where": f"/fsx/runs/{result.name}/out",  # the run folder, mapped back to what Argo would show
    }
    written = tmp_path / "state" / "volumes" / "fsx-claim" / "runs" / result.name / "out" / "greeting"
    assert written.read_text() == greeting
    assert "wrote " in (result.run_dir / "logs" / "train.log").read_text()
    assert not list(tmp_path.rglob("CANARY"))
    assert not (result.run_dir / "volumes" / "dshm").exists()  # /dev/shm stays the machine's own


def test_failed_entrypoint_is_retried_per_retry_strategy_with_a_new_job_each_time(tmp_path: Path) -> None:
    fail = "import sys; open(sys.argv[1], 'a').write(sys.argv[2] + '\\n'); print('raylet died'); sys.exit(1)"
    entrypoint = f'python -c {shlex.quote(fail)} /fsx/attempts "$ATTEMPT"'
    retry = {"limit": "1", "retryPolicy": "Always", "backoff": {"duration": "10ms", "factor": "2"}}
    manifest = workflow(
        [("train", None), ("collect", "train")],
        [
            resource("train", rayjob(entrypoint, env={"ATTEMPT": "{{retries}}"}), retryStrategy=retry),
            container("collect", ["true"]),
        ],
    )
    result = run(manifest, tmp_path)
    train = result.nodes["train"]
    assert phases(result) == {"train": "Failed", "collect": "Omitted"}
    assert train.retries == 1
    assert train.exit_code == 1
    assert train.message == "exit code 1: raylet died"  # the log's last line, as for a container
    assert (tmp_path / "state" / "volumes" / "fsx-claim" / "attempts").read_text().split() == ["0", "1"]
    assert result.phase == "Failed"
    assert "train" in result.message


def test_rayjob_deadline_kills_the_entrypoint_and_its_children(tmp_path: Path) -> None:
    entrypoint = "sleep 60 & echo $! > /fsx/child; wait"
    manifest = workflow([("train", None)], [resource("train", rayjob(entrypoint, activeDeadlineSeconds=1))])
    result = run(manifest, tmp_path)
    train = result.nodes["train"]
    assert train.phase == "Failed"
    assert "activeDeadlineSeconds=1" in train.message
    assert train.exit_code == 143  # SIGTERM
    child = int((tmp_path / "state" / "volumes" / "fsx-claim" / "child").read_text())
    deadline = time.monotonic() + 10
    while not ended(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ended(child)


def ended(pid: int) -> bool:
    """Gone, or a zombie: killed, and only waiting for init (its new parent) to reap it."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")


def test_a_run_folder_the_shell_line_cannot_carry_is_refused(tmp_path: Path) -> None:
    manifest = workflow([("train", None)], [resource("train", rayjob("touch /fsx/started"))])
    result = run_workflow(manifest, tmp_path / "my runs", cwd=tmp_path, console=Console(file=io.StringIO()))
    assert result.nodes["train"].phase == "Error"
    assert "a shell command line cannot carry unquoted; use a --state-dir" in result.nodes["train"].message
    assert not list(tmp_path.rglob("started"))


@pytest.mark.parametrize(
    ("devices", "expected"),
    [
        (
            {"worker_devices": {"nvidia.com/gpu": "4096"}},
            "the RayJob needs 8192 NVIDIA GPUs (workerGroupSpecs[0] 'gpu': 2 pods x 4096 nvidia.com/gpu), "
            "this machine has ",
        ),
        (
            {"head_devices": {"aws.amazon.com/neuron": "4096"}},
            "the RayJob needs 4096 Neuron devices (headGroupSpec: 1 pod x 4096 aws.amazon.com/neuron), this machine ",
        ),
    ],
    ids=["gpu", "neuron"],
)
def test_device_requests_beyond_this_machine_fail_before_anything_starts(
    tmp_path: Path, devices: dict[str, dict[str, str]], expected: str
) -> None:
    entrypoint = "touch /fsx/started"
    retry = {"limit": 2, "retryPolicy": "Always"}
    manifest = workflow(
        [("train", None), ("collect", "train")],
        [resource("train", rayjob(entrypoint, **devices), retryStrategy=retry), container("collect", ["true"])],
    )
    result = run(manifest, tmp_path)
    train = result.nodes["train"]
    assert phases(result) == {"train": "Failed", "collect": "Omitted"}
    assert train.message.startswith(expected), train.message
    assert train.message.endswith("run the cpu profile here (`run --variant cpu`) or `submit` to a cluster")
    assert train.retries == 0  # no retry can add a device
    assert not (tmp_path / "state" / "volumes" / "fsx-claim" / "started").exists()


def test_podgroup_is_admitted_without_a_process(tmp_path: Path) -> None:
    podgroup = {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "PodGroup",
        "metadata": {"name": "{{workflow.name}}-train-pg"},
        "spec": {"minMember": 3, "queue": "eksflow"},
    }
    manifest = workflow(
        [("gang", None), ("train", "gang")],
        [resource("gang", yaml.safe_dump(podgroup)), container("train", ["true"])],
    )
    result = run(manifest, tmp_path)
    assert phases(result) == {"gang": "Succeeded", "train": "Succeeded"}
    assert "gang admission by the Volcano scheduler" in result.nodes["gang"].message
    assert not (result.run_dir / "logs" / "gang.log").exists()  # no process ran for it


def test_a_volcano_job_is_refused_before_any_task_runs(tmp_path: Path) -> None:
    neuron = {"limits": {"aws.amazon.com/neuron": "16"}}
    pod = {
        "containers": [
            {"name": "train", "command": ["torchrun", "-m", "eksflow.llm.steps.train_neuron"], "resources": neuron}
        ]
    }
    job = {
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": {"name": "{{workflow.name}}-train-{{retries}}"},
        "spec": {"minAvailable": 2, "tasks": [{"name": "worker", "replicas": 2, "template": {"spec": pod}}]},
    }
    manifest = workflow(
        [("stage", None), ("train", "stage")], [container("stage", ["true"]), resource("train", yaml.safe_dump(job))]
    )
    expected = (
        "template 'train': a Volcano Job (tasks[0] 'worker': 2 pods x 16 aws.amazon.com/neuron) runs torchrun across "
        "pods that meet at the job's DNS names: cluster only; Neuron cores need Trainium; run the cpu profile here "
        "(`run --variant cpu`) or `submit` to a cluster"
    )
    with pytest.raises(LocalExecutorError) as refused:
        run(manifest, tmp_path)
    assert str(refused.value) == expected
    assert not (tmp_path / "state").exists()  # stage never ran


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda t, m: t["resource"].update(action="patch"), r"action 'patch' is not supported locally"),
        (
            lambda t, m: t["resource"].update(manifest="apiVersion: batch/v1\nkind: Job\n"),
            r"Job \(batch/v1\) does not run locally",
        ),
        (lambda t, m: t["resource"].update(manifest="spec: [unclosed\n"), r"is not valid YAML"),
        (lambda t, m: m["spec"].update(runtimeEnvYAML="env_vars: {}"), r"runtimeEnvYAML is not supported locally"),
        (lambda t, m: m["spec"].pop("entrypoint"), r"spec.entrypoint must be a string"),
        (
            lambda t, m: m["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0].update(
                env=[{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]
            ),
            r"containers\[0\].env\[0\].valueFrom is not supported locally",
        ),
        (lambda t, m: t.update(outputs={"parameters": [{"name": "x"}]}), r"outputs is not supported locally"),
        (lambda t, m: t.update(retryStrategy={"retryPolicy": "Always"}), r"retryStrategy.limit is required"),
    ],
    ids=["action", "kind", "not-yaml", "runtime-env", "no-entrypoint", "env-valueFrom", "outputs", "no-limit"],
)
def test_unsupported_resource_templates_are_rejected_up_front(tmp_path: Path, mutate: Any, message: str) -> None:
    manifest = yaml.safe_load(rayjob("true"))
    template = resource("train", "")
    mutate(template, manifest)
    if not template["resource"]["manifest"]:
        template["resource"]["manifest"] = yaml.safe_dump(manifest)
    with pytest.raises(LocalExecutorError, match=message):
        run(workflow([("train", None)], [template]), tmp_path)
    assert not (tmp_path / "state").exists()  # nothing ran, nothing was written


def fleet_object(template: ResourceTemplate) -> bool:
    manifest = yaml.safe_load(REFERENCE.sub(PLACEHOLDER, template.manifest))
    return (manifest["apiVersion"], manifest["kind"]) in FLEET_KINDS


def rendered(*overrides: str) -> dict[str, Any]:
    from tests import flagship

    return flagship.rendered(overrides)


@pytest.mark.parametrize(
    ("overrides", "resource_templates"),
    [
        (["cluster.instance_type=g5.12xlarge"], ["train"]),
        (["cluster.instance_type=g5.12xlarge", "cluster.scheduler=volcano"], ["train", "train-podgroup"]),
    ],
    ids=["gpu-kueue", "gpu-volcano"],
)
def test_rendered_cluster_variants_are_runnable_manifests(overrides: list[str], resource_templates: list[str]) -> None:
    parsed = parse_manifest(rendered(*overrides))
    jobs = [n for n, t in parsed.templates.items() if isinstance(t, ResourceTemplate) and not fleet_object(t)]
    assert sorted(jobs) == resource_templates  # besides the serving fleet's objects
    assert isinstance(parsed.templates["train-outputs"], ContainerTemplate)


def test_run_refuses_the_trainium_workflow_in_one_line_before_anything_runs(tmp_path: Path) -> None:
    from eksflow.run import execute

    workflow = rendered("cluster.instance_type=trn1.32xlarge")
    with pytest.raises(LocalExecutorError) as refused:
        execute(workflow, tmp_path / "state", None, Console(file=io.StringIO()), root=ROOT)
    line = f"{refused.value.label}: {refused.value}"  # what the command line prints, exit 2
    assert refused.value.exit_code == 2 and "\n" not in line
    assert line.startswith("cannot run locally: template 'train': a Volcano Job (tasks[0] 'worker': ")
    assert line.endswith(
        "Neuron cores need Trainium; run the cpu profile here (`run --variant cpu`) or `submit` to a cluster"
    )
    assert not (tmp_path / "state").exists()
