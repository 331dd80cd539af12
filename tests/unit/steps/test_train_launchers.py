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
    with pytest.raises(ValidationError, match=r"launcher\n  Input should be 'ray', 'local', 'mpi' or 'torchrun'"):
        train.Args.from_argv([*argv, "--launcher=horovod"])
    assert step.main([*argv, "--launcher=horovod"]) == 2


@pytest.mark.parametrize(
    ("launcher", "how"),
    [("mpi", "`mpirun -np N python -m eksflow.llm.steps.train"), ("torchrun", "`torchrun --nproc-per-node N -m")],
)
def test_a_ranks_launcher_outside_its_starter_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys, launcher, how):
    for name in ("TORCHELASTIC_RUN_ID", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "train.jsonl").write_text('{"prompt": "a", "completion": "b"}\n')
    argv = [f"--dataset-dir={tmp_path}", "--base-model=m", f"--output-dir={tmp_path}", f"--outputs-dir={tmp_path}"]
    assert step.main([*argv, f"--launcher={launcher}"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert f"--launcher={launcher} runs as a" in line and how in line
