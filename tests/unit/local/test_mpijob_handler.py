"""An MPIJob runs here as its launcher's mpirun, every worker pod being this host (eksflow/local/mpijob.py)."""

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from eksflow.local import LocalExecutorError
from eksflow.local.manifest import parse_manifest
from eksflow.local.model import ContainerTemplate, ResourceTemplate
from eksflow.local.mpijob import mpirun, mpirun_words
from eksflow.local.resources import describe, nvidia_gpus
from eksflow.local.substitution import PLACEHOLDER
from eksflow.manifests import REFERENCE
from tests.unit.local.test_resources import (
    FSX_MOUNT,
    FSX_VOLUME,
    container,
    fleet_object,
    phases,
    rendered,
    resource,
    run,
    workflow,
)

# Each rank writes what it sees into argv[1]/<rank>: the world, rank 0's address, an env value from each pod.
RANK_REPORT = """
import json, os, pathlib, sys
out = pathlib.Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
keys = ("OMPI_COMM_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "FROM_WORKER", "FROM_LAUNCHER")
(out / os.environ["OMPI_COMM_WORLD_RANK"]).write_text(json.dumps({k: os.environ.get(k) for k in keys}))
sys.exit(int(sys.argv[2]))
"""

pytestmark = pytest.mark.skipif(mpirun() is None, reason="no mpirun: `make setup` installs Open MPI's wheel")


def pod(container: dict[str, Any]) -> dict[str, Any]:
    return {"spec": {"containers": [container], "volumes": [FSX_VOLUME]}}


def mpijob(
    program: list[str], *, np: int = 4, slots: int = 2, workers: int = 2, wrapper: tuple[str, ...] = (), **spec: Any
) -> str:
    """An MPIJob shaped like eksflow.launchers.mpijob renders it: mpirun in the launcher, sshd workers, FSx on both."""
    command = [*wrapper, "mpirun", "-np", str(np), "--bind-to", "none", "--map-by", "slot"]
    command += ["-x", "MASTER_ADDR", "-x", "MASTER_PORT", "-x", "FROM_LAUNCHER"]
    launcher = {
        "name": "launcher",
        "image": "ghcr.io/eksflow/train-gpu:0.1.0",
        "command": command,
        "args": program,
        "env": [
            {"name": "MASTER_ADDR", "value": "{{workflow.name}}-train-worker-0.{{workflow.name}}-train"},
            {"name": "MASTER_PORT", "value": "29500"},
            {"name": "FROM_LAUNCHER", "value": "{{workflow.parameters.greeting}}"},
        ],
        "volumeMounts": [FSX_MOUNT],
    }
    worker = {
        "name": "worker",
        "image": "ghcr.io/eksflow/train-gpu:0.1.0",
        "command": ["/usr/sbin/sshd", "-De"],
        "env": [{"name": "FROM_WORKER", "value": "sshd's pod"}],
        "resources": {"limits": {"cpu": "4"}},
        "volumeMounts": [FSX_MOUNT],
    }
    manifest = {
        "apiVersion": "kubeflow.org/v2beta1",
        "kind": "MPIJob",
        "metadata": {"name": "{{workflow.name}}-train"},
        "spec": {
            "slotsPerWorker": slots,
            "launcherCreationPolicy": "WaitForWorkersReady",
            "runPolicy": {"cleanPodPolicy": "Running", "backoffLimit": 1},
            "mpiReplicaSpecs": {
                "Launcher": {"replicas": 1, "template": pod(launcher)},
                "Worker": {"replicas": workers, "template": pod(worker)},
            },
            **spec,
        },
    }
    return yaml.safe_dump(manifest, sort_keys=False)


def test_the_launchers_mpirun_starts_every_rank_here_with_both_pods_env_and_a_local_rank_0(tmp_path: Path) -> None:
    greeting = "hello $(touch CANARY) `touch CANARY`"
    program = ["python", "-c", RANK_REPORT, "/fsx/runs/{{workflow.name}}/ranks", "0"]
    manifest = workflow(
        [("train", None)],
        [resource("train", mpijob(program))],
        arguments={"parameters": [{"name": "greeting", "value": greeting}]},
    )
    result = run(manifest, tmp_path)
    assert phases(result) == {"train": "Succeeded"}, result.nodes["train"].message
    ranks = tmp_path / "state" / "volumes" / "fsx-claim" / "runs" / result.name / "ranks"
    seen = {int(p.name): yaml.safe_load(p.read_text()) for p in ranks.iterdir()}
    assert sorted(seen) == [0, 1, 2, 3]  # 2 worker pods x 2 slots, all on this host's hostfile
    (port,) = {s["MASTER_PORT"] for s in seen.values()}
    assert port != "29500" and int(port) > 0  # a free port here, the same for every rank
    for report in seen.values():
        assert report["OMPI_COMM_WORLD_SIZE"] == "4"
        assert report["MASTER_ADDR"] == "127.0.0.1"  # the first worker pod's DNS name exists only on the cluster
        assert report["FROM_WORKER"] == "sshd's pod" and report["FROM_LAUNCHER"] == greeting  # byte-identical
    assert not list(tmp_path.rglob("CANARY"))


def test_a_failing_rank_fails_the_job_with_its_exit_code(tmp_path: Path) -> None:
    program = ["python", "-c", RANK_REPORT, "/fsx/ranks", "3"]
    retry = {"limit": "1", "retryPolicy": "Always", "backoff": {"duration": "10ms"}}
    manifest = workflow(
        [("train", None)],
        [resource("train", mpijob(program, np=2), retryStrategy=retry)],
        arguments={"parameters": [{"name": "greeting", "value": "hi"}]},
    )
    result = run(manifest, tmp_path)
    train = result.nodes["train"]
    assert train.phase == "Failed" and train.exit_code == 3 and train.retries == 1  # retried like any job failure


def test_eksflows_wrapper_fails_an_mpirun_that_ends_0_without_the_steps_outputs(tmp_path: Path) -> None:
    """The launcher's command as eksflow renders it: mpirun's 0 counts only once rank 0 wrote the step's output."""
    wrapper = ("python", "-m", "eksflow.runtime.mpi_launcher", "--outputs-dir=/fsx/out", "--expect=done", "--")
    writes = (
        "import os, pathlib, sys\n"
        "if os.environ['OMPI_COMM_WORLD_RANK'] == '0':\n"
        "    pathlib.Path(sys.argv[1]).mkdir(parents=True); (pathlib.Path(sys.argv[1]) / 'done').touch()"
    )
    for program, phase in ((["python", "-c", "pass"], "Failed"), (["python", "-c", writes, "/fsx/out"], "Succeeded")):
        manifest = workflow(
            [("train", None)],
            [resource("train", mpijob(program, np=2, wrapper=wrapper))],
            arguments={"parameters": [{"name": "greeting", "value": "hi"}]},
        )
        result = run(manifest, tmp_path / phase)
        assert phases(result) == {"train": phase}, result.nodes["train"].message
    assert result.nodes["train"].exit_code == 0
    log = (tmp_path / "Failed").rglob("train.log")
    assert "error: mpirun exited 0 but the step wrote no done in" in next(log).read_text()


def test_only_mpirun_or_eksflows_wrapper_of_it_is_a_launcher_command() -> None:
    wrapped = ("python3", "-m", "eksflow.runtime.mpi_launcher", "--outputs-dir=/o", "--", "/usr/bin/mpirun", "-np")
    assert mpirun_words(wrapped) == ("/usr/bin/mpirun", "-np")
    assert mpirun_words(("mpirun", "-np", "2")) == ("mpirun", "-np", "2")
    assert mpirun_words(("python", "-m", "eksflow.runtime.mpi_launcher", "--", "deepspeed")) == ()
    assert mpirun_words(("python", "-m", "eksflow.runtime.mpi_launcher", "mpirun")) == ()  # no `--`
    assert mpirun_words(("bash", "-c", "mpirun -np 2")) == ()


@pytest.mark.skipif(nvidia_gpus()[0] >= 8, reason="this machine has the GPUs the rendered MPIJob asks for")
def test_gpus_this_machine_lacks_fail_the_job_in_one_line_before_mpirun_starts(tmp_path: Path) -> None:
    parsed = parse_manifest(rendered("cluster.instance_type=p4d.24xlarge", "cluster.launcher=mpijob"))
    jobs = [n for n, t in parsed.templates.items() if isinstance(t, ResourceTemplate) and not fleet_object(t)]
    assert jobs == ["train"]  # besides the serving fleet's objects
    assert isinstance(parsed.templates["train-outputs"], ContainerTemplate)
    template = parsed.templates["train"]
    assert isinstance(template, ResourceTemplate)
    job = describe(REFERENCE.sub(PLACEHOLDER, template.manifest), "train")
    assert job.kind == "MPIJob" and mpirun_words(job.argv)[0] == "mpirun" and "--launcher=mpi" in job.argv
    (workers,) = [d for d in job.devices if d.group == "Worker"]
    assert (workers.resource, workers.pods, workers.per_pod) == ("nvidia.com/gpu", 1, 8)
    manifest = workflow(
        [("train", None), ("collect", "train")],
        # the task outputs it takes (the staged dataset) as literals: this workflow has no stage task
        [
            resource("train", re.sub(r"\binputs\.parameters\.\w+", '"/fsx/x"', template.manifest)),
            container("collect", ["true"]),
        ],
        arguments={"parameters": [{"name": "base_model", "value": "smollm2-135m-instruct"}]},
    )
    result = run(manifest, tmp_path)
    train = result.nodes["train"]
    assert phases(result) == {"train": "Failed", "collect": "Omitted"}, train.message
    assert train.message.startswith("the MPIJob needs 8 NVIDIA GPUs (Worker: 1 pod x 8 nvidia.com/gpu), this machine")
    assert "\n" not in train.message and train.message.endswith("or `submit` to a cluster")
    assert not (result.run_dir / "logs" / "train.log").exists()  # mpirun never started


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"mpiImplementation": "Intel"}, r"runs only as Open MPI's mpirun"),
        ({"elasticPolicy": {}}, r"spec.elasticPolicy is not supported locally"),
        ({"runPolicy": {"suspend": True, "maxRestarts": 2}}, r"runPolicy.maxRestarts is not supported"),
    ],
    ids=["intel-mpi", "unknown-field", "unknown-run-policy"],
)
def test_what_cannot_run_here_is_refused_before_any_task_runs(tmp_path: Path, change: dict, message: str) -> None:
    manifest = yaml.safe_load(mpijob(["python", "-c", "pass"]))
    manifest["spec"].update(change)
    with pytest.raises(LocalExecutorError, match=message):
        run(workflow([("train", None)], [resource("train", yaml.safe_dump(manifest))]), tmp_path)
    assert not (tmp_path / "state").exists()


def test_a_launcher_that_is_not_mpirun_is_refused(tmp_path: Path) -> None:
    manifest = yaml.safe_load(mpijob([]))
    launcher = manifest["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
    launcher["command"] = ["bash", "-c", shlex.join(["deepspeed", "train.py"])]
    with pytest.raises(LocalExecutorError, match=r"launcher runs \['bash'\] with mpiImplementation OpenMPI"):
        run(workflow([("train", None)], [resource("train", yaml.safe_dump(manifest))]), tmp_path)
