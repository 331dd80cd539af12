"""The train step's `--launcher`: one launch function per name, and an unknown name refused when parsed (exit 2)."""

import typing

import pytest
from pydantic import ValidationError

from eksflow.llm.steps import train
from eksflow.llm.steps.train import step


def test_every_launcher_name_has_one_launch_function_and_a_description():
    assert list(step.LAUNCHES) == list(train.LAUNCHERS) == list(typing.get_args(train.Launcher))


def test_an_unknown_launcher_is_refused_naming_the_known_ones(tmp_path):
    argv = [f"--dataset-dir={tmp_path}", "--base-model=m", f"--output-dir={tmp_path}", f"--outputs-dir={tmp_path}"]
    with pytest.raises(ValidationError, match=r"launcher\n  Input should be 'ray', 'local' or 'mpi'"):
        train.Args.from_argv([*argv, "--launcher=torchrun"])
    assert step.main([*argv, "--launcher=torchrun"]) == 2
