"""A Secret a task mounts is, locally, this machine's own copy when there is one, else a folder of the run."""

from eksflow.local.model import Mount
from eksflow.local.parse_templates import parse_volumes


def test_a_secret_volume_is_the_machines_secret_folder_when_it_exists(tmp_path):
    volumes = parse_volumes(
        {
            "volumes": [
                {"name": "eksflow-slurm", "secret": {"secretName": "eksflow-slurm"}},
                {"name": "fsx", "persistentVolumeClaim": {"claimName": "fsx-claim"}},
                {"name": "scratch", "emptyDir": {}},
            ]
        },
        "template",
    )
    assert volumes == {
        "eksflow-slurm": ("secret", "eksflow-slurm"),
        "fsx": ("state", "fsx-claim"),
        "scratch": ("run", "scratch"),
    }
    state, run = tmp_path / "state", tmp_path / "run" / "volumes"
    mount = Mount("/etc/eksflow/slurm", *volumes["eksflow-slurm"], "")
    assert mount.host_folder(state, run) == run / "eksflow-slurm"  # nobody provided it: the run's (the fleet's keys)
    (state / "secrets" / "eksflow-slurm").mkdir(parents=True)
    assert mount.host_folder(state, run) == state / "secrets" / "eksflow-slurm"  # `make slurm-up` wrote the token
    assert Mount("/fsx", *volumes["fsx"], "runs").host_folder(state, run) == state / "volumes" / "fsx-claim" / "runs"
