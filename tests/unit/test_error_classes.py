"""Every error eksflow raises on purpose carries its own label and exit code; `cli.main` alone turns it into a line."""

import importlib
import pkgutil

import pytest

import eksflow
from eksflow.argo_client import ArgoServerError
from eksflow.cli import main
from eksflow.config import PipelineConfig
from eksflow.errors import EXIT_BAD_INPUT, EXIT_FAILED, ConfigError, EksflowError
from eksflow.pipeline import Pipeline


def _subclasses(cls: type[EksflowError]) -> set[type[EksflowError]]:
    found = set(cls.__subclasses__())
    return found.union(*(_subclasses(sub) for sub in found))


def _error_classes() -> list[type[EksflowError]]:
    for module in pkgutil.walk_packages(eksflow.__path__, "eksflow."):
        if not module.name.endswith(".__main__"):  # a step's `python -m` entry runs the step when imported
            importlib.import_module(module.name)
    return sorted({EksflowError} | _subclasses(EksflowError), key=lambda c: f"{c.__module__}.{c.__qualname__}")


ERROR_CLASSES = _error_classes()


@pytest.mark.parametrize("cls", ERROR_CLASSES, ids=lambda c: f"{c.__module__}.{c.__qualname__}")
def test_every_error_class_has_its_own_label_and_exit_code(cls: type[EksflowError]) -> None:
    # Its own, not inherited: a subclass (a setting refused before any request) may mean the opposite of its parent.
    assert "label" in cls.__dict__ and "exit_code" in cls.__dict__
    label = cls.label
    assert isinstance(label, str) and label.strip() == label and label and label == label.lower()
    assert not label.endswith(":")  # the command line adds the colon
    assert cls.exit_code in (EXIT_FAILED, EXIT_BAD_INPUT)


def test_the_walk_finds_the_error_classes_of_every_layer() -> None:
    found = {c.__qualname__ for c in ERROR_CLASSES}
    assert {"ArgoSettingError", "ConfigError", "RunServiceError", "ServingError", "StateWriteError"} <= found


def _raising(error: EksflowError):
    def build(cfg: PipelineConfig) -> Pipeline:
        raise error

    return build


@pytest.mark.parametrize(
    ("error", "code", "line"),
    [
        (ArgoServerError("no connection to the Argo Server"), 1, "argo server error: no connection to the Argo Server"),
        (ConfigError("train.max_steps: must be > 0"), 2, "config error: train.max_steps: must be > 0"),
    ],
    ids=["server-down-is-retried", "bad-config-is-not"],
)
def test_the_cli_prints_an_error_as_its_label_and_message_and_exits_with_its_code(capsys, error, code, line) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(_raising(error), ["render"])
    assert exit_info.value.code == code
    assert capsys.readouterr().err.splitlines() == [line]
