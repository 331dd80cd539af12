"""Memo keys hash the code a step runs (its module and the project modules it imports), not every file beside it.

An edit to one step's module changes its own key and the keys of the tasks memoized on its result; an edit to a
shared module changes the keys of exactly the steps that import it (at module level, inside a function, or
relatively); an edit that no step imports changes none.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from eksflow import Pipeline, PipelineConfig, task
from eksflow.render import manifest
from eksflow.step_code import step_sources

PACKAGE = "keyed_steps"  # a name no other test imports: the project's top-level package
STEP = """
from pydantic import BaseModel

from eksflow import StepArgs, run_step
{imports}

class Args(StepArgs):
    text: str = ""


class Outputs(BaseModel):
    value: str


def run(args: Args) -> Outputs:
    {body}
    return Outputs(value=args.text)


def main(argv: list[str] | None = None) -> int:
    return run_step(Args, run, argv)
"""
STEPS = {
    # imports the shared module at module level
    "first": STEP.format(imports=f"from {PACKAGE} import shared", body="shared.HELLO"),
    # imports it relatively, inside the function that uses it (as heavy imports are)
    "second": STEP.format(imports="", body="from .shared import HELLO  # noqa: F401"),
    # imports nothing of the project
    "third": STEP.format(imports="", body="pass"),
}


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A project of three steps, a module two of them share and one none imports, importable as PACKAGE."""
    package = tmp_path / PACKAGE
    package.mkdir()
    (package / "__init__.py").write_text('"""Steps."""\n')
    (package / "shared.py").write_text('HELLO = "hello"\n')
    (package / "unused.py").write_text('BYE = "bye"\n')
    for name, source in STEPS.items():
        (package / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield package
    for name in [m for m in sys.modules if m == PACKAGE or m.startswith(f"{PACKAGE}.")]:
        del sys.modules[name]


def memo_keys() -> dict[str, str]:
    """Each template's memo key, from the rendered workflow: one, two, three run first, second, third; four runs
    first again, memoized on three's result."""
    first, second, third = (importlib.import_module(f"{PACKAGE}.{name}") for name in ("first", "second", "third"))
    with Pipeline(PipelineConfig(name="keyed"), title="memo keys", parameters={"data": "d1"}) as p:
        data = p.parameters.data
        task(first, task_name="one", text="a", memoize=[data])
        task(second, task_name="two", text="a", memoize=[data])
        three = task(third, task_name="three", text="a", memoize=[data])
        task(first, task_name="four", text="b", memoize=[data, three])
    templates = manifest(p)["spec"]["templates"]
    return {t["name"]: t["memoize"]["key"] for t in templates if "memoize" in t}


def changed(before: dict[str, str], after: dict[str, str]) -> list[str]:
    assert before.keys() == after.keys() == {"one", "two", "three", "four"}
    return sorted(name for name in before if before[name] != after[name])


def test_an_edit_to_one_step_changes_only_its_key_and_the_keys_memoized_on_it(project: Path) -> None:
    before = memo_keys()
    with (project / "third.py").open("a") as source:
        source.write("\nLIMIT = 2\n")
    assert changed(before, memo_keys()) == ["four", "three"]


def test_an_edit_to_a_shared_module_changes_the_keys_of_exactly_the_steps_importing_it(project: Path) -> None:
    before = memo_keys()
    (project / "shared.py").write_text('HELLO = "bonjour"\n')
    assert changed(before, memo_keys()) == ["four", "one", "two"]  # four runs `first`, which imports it


def test_an_edit_no_step_imports_changes_no_key(project: Path) -> None:
    before = memo_keys()
    (project / "unused.py").write_text('BYE = "au revoir"\n')
    assert changed(before, memo_keys()) == []


def test_the_sdk_a_step_runs_is_part_of_its_code_and_the_authoring_layer_is_not(project: Path) -> None:
    """`from eksflow import run_step` runs eksflow.runtime.args (loaded on first use); hera's side never runs."""
    modules = [source.partition("\n")[0] for source in step_sources(importlib.import_module(f"{PACKAGE}.third"))]
    assert {"eksflow", "eksflow.runtime.args", f"{PACKAGE}", f"{PACKAGE}.third"} <= set(modules)
    assert not {"eksflow.pipeline", "eksflow.templates", f"{PACKAGE}.shared", f"{PACKAGE}.unused"} & set(modules)


LLM_STEPS = [
    "eksflow.llm.steps.stage_data",
    "eksflow.llm.steps.validate_data",
    "eksflow.llm.steps.train",
    "eksflow.llm.steps.evaluate",
    "eksflow.llm.steps.register",
    "eksflow.llm.steps.canary",
    "eksflow.llm.steps.promote",
]


@pytest.mark.parametrize(
    ("module", "runs_it"),
    [
        ("eksflow.llm.steps.train.loop", ["eksflow.llm.steps.train"]),  # a step's own module: that step only
        ("eksflow.llm.steps.evaluate.scoring", ["eksflow.llm.steps.evaluate"]),  # imported inside a function
        ("eksflow.llm.steps.register", ["eksflow.llm.steps.register"]),
    ],
)
def test_the_flagship_steps_code_is_what_they_import(module: str, runs_it: list[str]) -> None:
    """eksflow's own steps: an edit to one step's module is in that step's code only."""
    steps = {name: importlib.import_module(name) for name in LLM_STEPS}
    holding = [name for name, step in steps.items() if module in [s.partition("\n")[0] for s in step_sources(step)]]
    assert holding == runs_it
