"""A run name is a workflow name, resolved only inside the state folder: every verb refuses anything else, exit 2.

A planted run folder outside the state folder (status.json, manifest.yaml, a log holding PLANTED) is what `get`,
`logs` and `run --resume` would have read through `../../evil` or an absolute path.
"""

import shutil
from pathlib import Path

import pytest

from eksflow import local
from eksflow.cli import main
from eksflow.local import LocalExecutorError
from eksflow.local.manifest import parse_manifest
from eksflow.names import MAX_WORKFLOW_NAME, workflow_name_problem
from pipelines.llama_lora import build
from tests.contract.fake_argo import start
from tests.unit.local.manifests import WRITE_OUTPUT, container, outputs, run, task, workflow

PLANTED = "PLANTED-outside-the-state-folder"


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """A state folder with one real run, and a copy of that run planted outside it, its log and message marked."""
    root = tmp_path_factory.mktemp("names")
    manifest = workflow([task("train", "train")], [container("train", WRITE_OUTPUT, "/tmp/outputs/x", PLANTED)])
    manifest["spec"]["templates"][0]["outputs"] = outputs("x")
    done = run(manifest, root)
    planted = root / "outside" / "evil"
    shutil.copytree(done.run_dir, planted)
    (planted / "logs" / "train.log").write_text(f"{PLANTED}\n")
    status = planted / "status.json"
    status.write_text(status.read_text().replace('"phase":"Succeeded"', '"phase":"Failed"', 1))
    return root / "state", planted, done.name


def hostile_names(planted: Path) -> dict[str, str]:
    return {
        "parent": "../../outside/evil",
        "absolute": str(planted),
        "dot-dot": "..",
        "dot": ".",
        "inner-slash": "x/../../../outside/evil",
        "5000-chars": "a" * 5000,
        "254-chars": "a" * (MAX_WORKFLOW_NAME + 1),
        "uppercase": "Llama-lora-x7k2p",
        "escape": "llama\x1b[2J",
        "empty": "",
    }


NAMES = list(hostile_names(Path("/p")))
VERBS = {
    "get": lambda name: ["get", name],
    "logs": lambda name: ["logs", name],
    "logs-task": lambda name: ["logs", name, "train"],
    "retry": lambda name: ["retry", name],
    "resubmit": lambda name: ["resubmit", name],
    "run-resume": lambda name: ["run", "--resume", name],
}


def _never(*args, **kwargs):
    raise AssertionError("a fresh run started")


def cli(capsys, argv):
    with pytest.raises(SystemExit) as exit_info:
        main(build, argv)
    out, err = capsys.readouterr()
    return exit_info.value.code, out, err


@pytest.mark.parametrize("verb", VERBS, ids=VERBS)
@pytest.mark.parametrize("which", NAMES, ids=NAMES)
def test_a_name_that_is_no_workflow_name_is_refused_by_every_local_verb(folders, capsys, monkeypatch, verb, which):
    state, planted, _ = folders
    monkeypatch.delenv("ARGO_SERVER", raising=False)
    monkeypatch.setattr(local, "run_workflow", _never)  # `run --resume NAME` must not fall back to a fresh run
    monkeypatch.chdir(Path(__file__).resolve().parents[2])  # where the flagship's data/demo is, for `run`
    name = hostile_names(planted)[which]
    code, out, err = cli(capsys, [*VERBS[verb](name), "--state-dir", str(state)])
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and "is not a workflow name" in err, err
    assert PLANTED not in out + err and "\x1b" not in out + err
    assert len(err) < 600  # the 5,000-character name is shortened, not repeated


REMOTE_VERBS = {k: v for k, v in VERBS.items() if k != "run-resume"}


@pytest.mark.parametrize("verb", REMOTE_VERBS, ids=REMOTE_VERBS)
@pytest.mark.parametrize("which", NAMES, ids=NAMES)
def test_a_name_that_is_no_workflow_name_is_refused_before_any_request(capsys, monkeypatch, verb, which):
    fake, stop = start()
    try:
        monkeypatch.setenv("ARGO_SERVER", fake.address)
        monkeypatch.setenv("ARGO_SECURE", "false")
        code, _, err = cli(capsys, REMOTE_VERBS[verb](hostile_names(Path("/p"))[which]))
    finally:
        stop()
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and "is not a workflow name" in err, err
    assert fake.requests == []


@pytest.mark.parametrize("task_name", ["../../../outside/evil/logs/train", "/etc/passwd", "train/../../x"])
def test_the_task_of_logs_is_a_task_of_the_run_never_a_path(folders, capsys, monkeypatch, task_name):
    state, planted, name = folders
    monkeypatch.delenv("ARGO_SERVER", raising=False)
    code, out, err = cli(
        capsys, ["logs", name, task_name.replace("/outside/evil", str(planted)), "--state-dir", str(state)]
    )
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and "give one of: train" in err
    assert PLANTED not in out and "root:" not in out


def test_a_run_in_the_state_folder_is_still_found(folders, capsys, monkeypatch):
    state, _, name = folders
    monkeypatch.delenv("ARGO_SERVER", raising=False)
    code, out, _ = cli(capsys, ["logs", name, "train", "--state-dir", str(state)])
    assert code == 0 and "attempt 1" in out


@pytest.mark.parametrize(
    "metadata",
    [{"name": "../evil"}, {"name": "Evil"}, {"generateName": "../"}, {"generateName": "a" * 249}, {"name": "a" * 254}],
    ids=["name-path", "name-uppercase", "generate-path", "generate-too-long", "name-too-long"],
)
def test_the_executor_makes_only_runs_the_verbs_can_name(metadata):
    manifest = workflow([task("t", "t")], [container("t", "pass")])
    manifest["metadata"] = metadata
    with pytest.raises(LocalExecutorError, match=r"metadata: .*workflow name"):
        parse_manifest(manifest)


@pytest.mark.parametrize("name", ["llama-lora-x7k2p", "a", "a.b-c", "0" * MAX_WORKFLOW_NAME, "test-8nq5d"])
def test_workflow_names(name):
    assert workflow_name_problem(name) == ""
