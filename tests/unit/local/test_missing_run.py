"""A run (or task) that is not there is "not found", exit 2, one line naming what is there: never a config error."""

from pathlib import Path

import pytest

from eksflow import local
from eksflow.cli import main
from pipelines.llama_lora import build
from tests.unit.local.manifests import container, run, task, workflow

VERBS = {
    "get": ["get", "nosuchrun"],
    "logs": ["logs", "nosuchrun"],
    "logs-task": ["logs", "nosuchrun", "train"],
    "retry": ["retry", "nosuchrun", "-p", "x=1"],
    "resubmit": ["resubmit", "nosuchrun"],
    "run-resume": ["run", "--resume", "nosuchrun"],
}


@pytest.fixture(scope="module")
def state(tmp_path_factory) -> tuple[Path, str]:
    root = tmp_path_factory.mktemp("missing")
    done = run(workflow([task("train", "train")], [container("train", "print('trained')")]), root)
    return root / "state", done.name


def cli(capsys, argv: list[str]) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exit_info:
        main(build, argv)
    return exit_info.value.code, capsys.readouterr().err


@pytest.mark.parametrize("verb", VERBS, ids=VERBS)
def test_a_missing_run_is_not_found_for_every_verb(state, capsys, monkeypatch, verb):
    folder, existing = state
    monkeypatch.delenv("ARGO_SERVER", raising=False)
    monkeypatch.chdir(Path(__file__).resolve().parents[3])  # where the flagship's data/demo is, for `run`
    code, err = cli(capsys, [*VERBS[verb], "--state-dir", str(folder)])
    assert code == 2
    assert err.strip().splitlines() == [f"not found: no run 'nosuchrun' in {folder / 'runs'} (runs there: {existing})"]


def test_a_missing_task_of_a_run_is_not_found(state, capsys, monkeypatch):
    folder, existing = state
    monkeypatch.delenv("ARGO_SERVER", raising=False)
    code, err = cli(capsys, ["logs", existing, "evaluate", "--state-dir", str(folder)])
    assert code == 2
    assert err.strip().splitlines() == [
        f"not found: no node of run {existing!r} is called 'evaluate'; give one of: train"
    ]


def test_not_found_has_its_own_label_and_exit_code_under_the_error_root():
    from eksflow.errors import NotFoundError  # here: the verbs' tests above also run where it does not exist

    with pytest.raises(NotFoundError) as raised:
        local.load_run(Path("/nonexistent-state"), "nosuchrun")
    assert (raised.value.label, raised.value.exit_code) == ("not found", 2)
    assert isinstance(raised.value, local.LocalExecutorError)  # what callers of the library API already catch
