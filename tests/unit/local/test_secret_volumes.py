"""A Secret a task mounts is, locally, this machine's own copy when there is one, else a folder of the run.

The step sees a read-only copy of it for the attempt, and no name in a manifest maps a mount outside its base.
"""

import json

import pytest

from eksflow.local import LocalExecutorError
from eksflow.local.model import Mount
from eksflow.local.parse_templates import parse_volumes
from tests.unit.local.manifests import container, outputs, phases, run, task, workflow


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


READ_AND_TAMPER = """
import json, os, stat, sys, pathlib
folder, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
seen = {
    "token": (folder / "token").read_text(),
    "modes": [oct(stat.S_IMODE(p.stat().st_mode)) for p in (folder, folder / "token")],
    "files": sorted(os.listdir(folder)),
}
for tamper in (lambda: (folder / "token").write_text("changed"), lambda: (folder / "planted").write_text("x"),
               lambda: (folder / "token").unlink()):
    try:  # what a careless or hostile step would do: whatever the modes let through, it changes only its copy
        tamper()
    except OSError:
        pass
out.parent.mkdir(parents=True, exist_ok=True)
out.write_text(json.dumps(seen))
"""


def keyed_workflow(volume: str, secret: str) -> dict:
    reader = container("reader", READ_AND_TAMPER, "/etc/keys", "/tmp/outputs/seen", outputs=outputs("seen"))
    reader["container"]["volumeMounts"] = [{"name": volume, "mountPath": "/etc/keys", "readOnly": True}]
    reader["volumes"] = [{"name": volume, "secret": {"secretName": secret}}]
    return workflow([task("reader", "reader")], [reader])


def test_a_step_reads_its_secret_and_cannot_change_it(tmp_path):
    secret = tmp_path / "state" / "secrets" / "keys"
    secret.mkdir(parents=True)
    (secret / "token").write_text("s3cret")
    (secret / "link").symlink_to(tmp_path / "elsewhere")  # a link is no part of the Secret: not followed
    (tmp_path / "elsewhere").write_text("not a key")
    done = run(keyed_workflow("keys", "keys"), tmp_path)
    assert phases(done) == {"reader": "Succeeded"}, done.output
    seen = json.loads(done.nodes["reader"].outputs["seen"])
    assert seen == {"token": "s3cret", "modes": ["0o500", "0o400"], "files": ["token"]}
    assert sorted(p.name for p in secret.iterdir()) == ["link", "token"]
    assert (secret / "token").read_text() == "s3cret"
    assert [p for p in done.run_dir.rglob("*") if p.name in ("token", "planted")] == []  # the copy went with it


def test_a_secret_named_to_leave_the_state_folder_is_refused_before_anything_runs(tmp_path):
    victim = tmp_path / "victimdir"  # <state>/secrets/../../victimdir
    victim.mkdir()
    (victim / "token").write_text("untouched")
    hostile = "../../victimdir"
    with pytest.raises(LocalExecutorError, match=r"^spec.templates\[0\].volumes\[0\].name: '../../victimdir' is not"):
        run(keyed_workflow(hostile, hostile), tmp_path)
    assert sorted(p.name for p in victim.iterdir()) == ["token"]
    assert (victim / "token").read_text() == "untouched"
    assert not (tmp_path / "state" / "runs").exists() or not any((tmp_path / "state" / "runs").iterdir())


@pytest.mark.parametrize(
    ("volume", "field", "problem"),
    [
        ({"name": "../x", "emptyDir": {}}, "volumes[0].name", "is not a DNS-1123 label"),
        ({"name": "Keys", "secret": {"secretName": "Keys"}}, "volumes[0].name", "is not a DNS-1123 label"),
        ({"name": "keys", "secret": {"secretName": "../keys"}}, "volumes[0].secret.secretName", "not a DNS-1123"),
        ({"name": "data", "persistentVolumeClaim": {"claimName": "/etc"}}, "volumes[0].persistentVolumeClaim.claimName",
         "is not a DNS-1123 subdomain"),
    ],
    ids=["volume-dotdot", "volume-upper", "secret-dotdot", "claim-absolute"],
)  # fmt: skip
def test_a_volume_whose_names_break_kubernetes_rules_is_refused_naming_the_field(volume, field, problem):
    with pytest.raises(LocalExecutorError) as refused:
        parse_volumes({"volumes": [volume]}, "template 'x'")
    assert str(refused.value).startswith(f"template 'x'.{field}: "), refused.value
    assert problem in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.parametrize(
    "mount",
    [
        Mount("/etc/x", "secret", "../../victimdir", ""),
        Mount("/etc/x", "secret", "keys/..", ""),
        Mount("/etc/x", "state", "..", ""),
        Mount("/data", "state", "claim", "../../../victimdir"),
        Mount("/data", "run", "scratch", "/etc"),
        Mount("/data", "run", "", ""),
    ],
    ids=["secret-dotdot", "secret-slash", "claim-dotdot", "subpath-dotdot", "subpath-absolute", "empty"],
)
def test_no_mount_maps_outside_its_base_whatever_the_manifest_holds(tmp_path, mount):
    with pytest.raises(LocalExecutorError, match="would name a folder outside the state folder"):
        mount.host_folder(tmp_path / "state", tmp_path / "state" / "runs" / "r" / "volumes")


def test_a_secret_folder_linked_outside_the_state_folder_is_refused(tmp_path):
    state = tmp_path / "state"
    (state / "secrets").mkdir(parents=True)
    (tmp_path / "victimdir").mkdir()
    (state / "secrets" / "keys").symlink_to(tmp_path / "victimdir")
    with pytest.raises(LocalExecutorError, match=r"^Secret 'keys' at /etc/x: its folder .* leads outside"):
        Mount("/etc/x", "secret", "keys", "").host_folder(state, state / "runs" / "r" / "volumes")
