"""The argv contract between the pipeline (to_argv) and each step (StepArgs.from_argv)."""

from pathlib import Path
from typing import Literal

import pytest
from pydantic import BaseModel, Field, ValidationError

from eksflow.runtime.args import Settings, StepArgs, StepInputError, run_step, to_argv


class Nested(Settings):
    rank: int = 8
    modules: tuple[str, ...] = ("q_proj",)


class DemoArgs(StepArgs):
    name: str
    steps: int = Field(10, ge=1)
    rate: float = 0.1
    enabled: bool = False
    mode: Literal["ddp", "fsdp"] = "ddp"
    nested: Nested = Nested()
    limits: dict[str, float] = {}
    where: Path = Path("/tmp")


def test_round_trip_of_every_field_type():
    values = {
        "name": "a b",
        "steps": 3,
        "rate": 0.5,
        "enabled": True,
        "mode": "fsdp",
        "nested": Nested(rank=4, modules=("k", "v")),
        "limits": {"x": 1.5},
        "where": Path("/fsx/run"),
    }
    parsed = DemoArgs.from_argv(to_argv(values))
    assert parsed.model_dump(exclude={"outputs_dir"}) == DemoArgs(**values).model_dump(exclude={"outputs_dir"})


@pytest.mark.parametrize(
    "value",
    [
        "'''",
        '"quoted"',
        "$(touch /tmp/pwn)",
        "`id`",
        "a; rm -rf /",
        "line1\nline2",
        "{{workflow.name}}",
        "日本語",
        "5",
        "true",
        "[1, 2]",
        "--name=x",
    ],
    ids=[
        "triple-quote",
        "quotes",
        "subshell",
        "backticks",
        "semicolon",
        "newline",
        "argo-expr",
        "non-ascii",
        "number-like",
        "bool-like",
        "json-like",
        "flag-like",
    ],
)
def test_text_values_arrive_byte_identical(value):
    assert DemoArgs.from_argv(to_argv({"name": value})).name == value


def test_unknown_flag_names_the_known_ones():
    with pytest.raises(StepInputError, match=r"unknown argument '--stpes'.*--steps"):
        DemoArgs.from_argv(["--name=x", "--stpes=3"])


def test_item_without_equals_is_refused():
    with pytest.raises(StepInputError, match="--name=value"):
        DemoArgs.from_argv(["--name", "x"])


def test_out_of_range_value_is_a_validation_error():
    with pytest.raises(ValidationError, match="greater than or equal to 1"):
        DemoArgs.from_argv(["--name=x", "--steps=0"])


class DemoOutputs(BaseModel):
    answer: str
    passed: bool
    score: float


def test_run_step_writes_outputs_and_exits_2_on_bad_input(tmp_path, capsys):
    def core(args: DemoArgs) -> DemoOutputs:
        return DemoOutputs(answer=args.name, passed=True, score=2 / 3)

    assert run_step(DemoArgs, core, [f"--outputs-dir={tmp_path}", "--name=hi"]) == 0
    written = {p.name: p.read_text() for p in tmp_path.iterdir()}
    assert written == {"answer": "hi", "passed": "true", "score": "0.6666666666666666"}  # full precision

    assert run_step(DemoArgs, core, [f"--outputs-dir={tmp_path / 'bad'}", "--name=hi", "--steps=-1"]) == 2
    err = capsys.readouterr().err
    assert "--steps" in err and "greater than or equal to 1" in err
    assert not (tmp_path / "bad").exists()


@pytest.mark.parametrize("value", [5e-05, 0.1, 1 / 3, 123456.789, 1e-12])
def test_float_outputs_keep_full_precision(value):
    from eksflow.runtime.outputs import output_text

    assert float(output_text(value)) == value
