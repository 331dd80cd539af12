"""One exception root: every error eksflow raises on purpose is an EksflowError, which the command line prints as one
line and ends with its exit code."""

import importlib
import inspect
import pkgutil

import pytest

import eksflow
from eksflow import PipelineConfig, StepFailedError, name_field
from eksflow.cli import main
from eksflow.errors import EXIT_BAD_INPUT, EXIT_FAILED, EksflowError
from eksflow.local import RunServiceError


def sdk_exceptions() -> list[type[BaseException]]:
    found = []
    for info in pkgutil.walk_packages(eksflow.__path__, "eksflow."):
        if info.name.startswith("eksflow.llm.steps."):  # steps end through run_step's exit codes, not this CLI
            continue
        module = importlib.import_module(info.name)
        found += [
            obj
            for _, obj in inspect.getmembers(module, inspect.isclass)
            if issubclass(obj, BaseException) and obj.__module__ == info.name
        ]
    return found


def test_every_public_exception_of_the_sdk_has_one_root():
    exceptions = sdk_exceptions()
    assert len(exceptions) > 10
    outside = [
        f"{e.__module__}.{e.__name__}"
        for e in exceptions
        if not issubclass(e, EksflowError)
        and not issubclass(e, KeyboardInterrupt)  # a run stopped by a signal ends as Ctrl-C does
        and not e.__name__.startswith("_")
    ]
    assert outside == []


class Config(PipelineConfig):
    name: str = name_field("raises")


@pytest.mark.parametrize(
    ("error", "line", "code"),
    [
        (RunServiceError("no engine answered"), "run service error: no engine answered", EXIT_FAILED),
        (RunServiceError("no such kind", retriable=False), "run service error: no such kind", EXIT_BAD_INPUT),
        (StepFailedError("the server is down"), "error: the server is down", EXIT_FAILED),
    ],
)
def test_the_command_line_prints_any_eksflow_error_as_one_line_with_its_exit_code(capsys, error, line, code):
    def build(cfg: Config):
        raise error

    with pytest.raises(SystemExit) as exited:
        main(build, ["render"])
    assert exited.value.code == code
    assert capsys.readouterr().err.strip() == line
