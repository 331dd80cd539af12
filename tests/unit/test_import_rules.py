"""The dependency rules that keep eksflow easy to change, enforced rather than hoped for.

- The SDK (every module of eksflow/) and rendering a pipeline (what `render`, `plan` and `submit` do) import none
  of the heavy ML or cloud libraries: `pip install eksflow` holds none (tests/contract/test_bare_install.py).
- Steps import neither hera nor eksflow's authoring layer: a step image needs only eksflow.runtime (and
  eksflow.errors, the exit codes and the exception root it builds on).
- A step's contract (what a pipeline imports to wire it) is light too.
- The LiteLLM proxy's callback (steps/common/litellm_routes.py) imports nothing of this project.
"""

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from eksflow import runtime

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "ray", "mlflow", "transformers", "peft", "boto3", "botocore", "great_expectations", "pandas")
PIPELINES = sorted(p.stem for p in (ROOT / "pipelines").glob("*.py") if p.stem != "__init__")
STEP_FILES = sorted(p for p in (ROOT / "steps").rglob("*.py"))
RUNTIME_NAMES = set(runtime.__all__)  # what `from eksflow import X` may give a step: the runtime's names


def loaded_after(code: str) -> list[str]:
    """Top-level packages in sys.modules after running `code` in a fresh interpreter."""
    probe = f"{code}\nimport json, sys; print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}})))"
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_rendering_a_pipeline_imports_nothing_heavy(pipeline):
    code = (
        f"from pipelines import {pipeline} as p\n"
        "from eksflow.cli import config_type\n"
        "from eksflow.config import load_config\n"
        "from eksflow.plan import check\n"
        "from eksflow.templates import manifest\n"
        "built = p.build(load_config(config_type(p.build)))\n"
        "manifest(built); check(built)\n"
    )
    assert sorted(set(loaded_after(code)) & set(HEAVY)) == []


def test_no_module_of_the_sdk_imports_anything_heavy():
    code = (
        "import importlib, pkgutil, eksflow\n"
        "for m in pkgutil.walk_packages(eksflow.__path__, 'eksflow.'):\n"
        "    importlib.import_module(m.name)\n"
    )
    assert sorted(set(loaded_after(code)) & set(HEAVY)) == []


def imports(path: Path) -> list[str]:
    """Every module a file imports, with `from x import y` as `x.y` when y may be a module."""
    names = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names += [f"{node.module}.{alias.name}" for alias in node.names]
    return names


def test_the_proxy_callback_imports_nothing_of_this_project():
    """steps/common/litellm_routes.py runs inside the LiteLLM proxy's virtualenv: no eksflow, no steps there."""
    found = imports(ROOT / "steps" / "common" / "litellm_routes.py")
    assert [n for n in found if n.partition(".")[0] in ("eksflow", "steps", "pipelines")] == []


@pytest.mark.parametrize("path", STEP_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_steps_import_neither_hera_nor_the_authoring_layer(path):
    bad = []
    for name in imports(path):
        top, _, rest = name.partition(".")
        if top in ("hera", "pipelines") or (
            top == "eksflow" and not (rest.startswith(("runtime", "errors")) or rest in RUNTIME_NAMES)
        ):
            bad.append(name)
    assert bad == [], f"{path.relative_to(ROOT)} imports the authoring side: {bad}"


def test_step_contracts_are_light():
    contracts = sorted(
        {f"steps.{p.parent.name}" for p in (ROOT / "steps").glob("*/__init__.py") if p.parent.name != "common"}
        | {f"steps.{p.stem}" for p in (ROOT / "steps").glob("*.py") if p.stem != "__init__"}
    )
    loaded = loaded_after("\n".join(f"import {c}" for c in contracts))
    assert sorted(set(loaded) & set(HEAVY)) == []
    assert "hera" not in loaded
