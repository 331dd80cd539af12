"""`python -m eksflow.llm.steps.<name> --help` (and -h) works for every step: each argument's type, default, use."""

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import Field

from eksflow.runtime.args import StepArgs, describe, encode, flag, run_step, type_name

STEPS_DIR = Path(__file__).resolve().parents[2] / "eksflow" / "llm" / "steps"
SUBPROCESS_LIMIT_S = 300  # only a hang reaches it; --help imports no ML library and takes about a second


def step_modules() -> list[str]:
    """Every runnable step: a module under eksflow/llm/steps/ that calls run_step, or a package with a __main__."""
    names = [p.stem for p in STEPS_DIR.glob("*.py") if "run_step(" in p.read_text(encoding="utf-8")]
    names += [p.parent.name for p in STEPS_DIR.glob("*/__main__.py")]
    return sorted(names)


STEPS = step_modules()


def test_discovery_finds_the_steps():
    # a guard against a discovery that silently finds nothing (the help test would then pass vacuously)
    assert {"stage_data", "validate_data", "train", "evaluate", "register", "promote"} <= set(STEPS)


@pytest.fixture(scope="module")
def helps() -> dict[tuple[str, str], subprocess.CompletedProcess]:
    """Run every step's --help and -h at once: a second each, in parallel."""
    env = {**os.environ, "PYTHONPATH": str(STEPS_DIR.parent)}
    procs = {
        (name, option): subprocess.Popen(
            [sys.executable, "-m", f"eksflow.llm.steps.{name}", option],
            cwd=STEPS_DIR.parent,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in STEPS
        for option in ("--help", "-h")
    }
    done = {}
    for key, proc in procs.items():
        out, err = proc.communicate(timeout=SUBPROCESS_LIMIT_S)
        done[key] = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    return done


def args_model(name: str) -> type[StepArgs]:
    module = importlib.import_module(f"eksflow.llm.steps.{name}")
    return module.Args


@pytest.mark.parametrize("option", ["--help", "-h"])
@pytest.mark.parametrize("name", STEPS)
def test_help_lists_every_argument(helps, name, option):
    result = helps[(name, option)]
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    text = result.stdout
    for field_name, field in args_model(name).model_fields.items():
        assert field.description, f"eksflow.llm.steps.{name}: {flag(field_name)} has no description"
        assert f"{flag(field_name)}={type_name(field.annotation)}" in text
        assert field.description in text
        if field.is_required():
            assert f"{flag(field_name)}={type_name(field.annotation)}  (required)" in text
        elif field.default_factory is None:
            assert repr(encode(field.default))[:60] in text


class Demo(StepArgs):
    """Demo step."""

    name: str = Field(description="a name")
    where: Path = Field(default_factory=lambda: Path("/computed"), description="a computed default")
    broken: int = Field(default_factory=lambda: 1 // 0, description="a factory that fails")
    mode: tuple[int, ...] = Field((1, 2), description="some numbers")


def test_describe_shows_types_and_computed_defaults():
    text = describe(Demo)
    assert "  --name=text  (required)\n      a name" in text
    assert "  --where=path  (default '/computed')" in text
    assert "  --broken=int  (default computed at run time)" in text
    assert "  --mode=list of int  (default '[1,2]')" in text


def test_help_anywhere_in_argv_prints_help_and_exits_0(capsys):
    assert run_step(Demo, lambda args: args, ["--name=x", "--help"]) == 0
    assert "--name=text" in capsys.readouterr().out
