"""The flat public namespaces (eksflow, eksflow.llm): each name a user imports is the object its module defines,
listed in the namespace's own doc, loaded on first use, and a step's names never load the authoring layer."""

from __future__ import annotations

import importlib
import json
import re
import subprocess
import sys
from types import ModuleType

import pytest

import eksflow
import eksflow.llm
from eksflow.conditions import Condition
from eksflow.refs import Ref

NAMESPACES = [eksflow, eksflow.llm]


@pytest.mark.parametrize("package", NAMESPACES, ids=lambda p: p.__name__)
def test_every_public_name_is_the_object_its_module_defines(package: ModuleType) -> None:
    lazy: dict[str, str] = package._PUBLIC  # type: ignore[attr-defined]
    assert sorted(package.__all__) == sorted(lazy)  # `from eksflow import *` gives what the map loads
    wrong = [
        name
        for name, module in lazy.items()
        if getattr(package, name) is not vars(importlib.import_module(module))[name]
    ]
    assert wrong == []


@pytest.mark.parametrize("package", NAMESPACES, ids=lambda p: p.__name__)
def test_every_public_name_is_in_the_namespaces_doc(package: ModuleType) -> None:
    documented = set(re.findall(r"\w+", package.__doc__ or ""))
    assert sorted(set(package.__all__) - documented) == []


def test_a_misspelt_name_says_which_names_there_are() -> None:
    with pytest.raises(
        AttributeError, match=r"^module 'eksflow' has no attribute 'Pipline'; public names: .*\bPipeline\b"
    ):
        eksflow.Pipline  # noqa: B018


def test_a_steps_names_load_without_the_authoring_layer() -> None:
    """`from eksflow import StepArgs, run_step, ...` in a step image: no hera, no pipeline, no config."""
    names = sorted(n for n, module in eksflow._PUBLIC.items() if module.startswith("eksflow.runtime"))  # type: ignore[attr-defined]
    assert {
        "Location",
        "Progress",
        "Settings",
        "StepArgs",
        "StepFailedError",
        "StepInputError",
        "run_step",
        "task_metric",
    } <= set(names)
    probe = f"from eksflow import {', '.join(names)}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    loaded = json.loads(
        subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    )
    assert [m for m in loaded if m.split(".")[0] == "hera" or m in ("eksflow.pipeline", "eksflow.config")] == []


def test_when_is_a_ref_or_a_condition() -> None:
    assert eksflow.When == Ref | Condition
