"""`pip install eksflow` alone is enough to author, render and run a pipeline whose steps are plain Python.

The distribution is built from this checkout's files (pyproject.toml, README.md, eksflow/) into a fresh virtualenv
with nothing else: no extras, no torch. In it, the user project (tests/fixtures/greeter) renders strictly valid
Argo and runs locally, this project's LLM pipelines render (their steps' contracts are light), and every module of
the SDK imports, with eksflow's LLM library and its steps' contracts.
"""

import json
import os
import shutil
import subprocess
import venv
from pathlib import Path

import pytest
import yaml

from tests.contract.test_rendered import errors

pytestmark = pytest.mark.slow  # one pip install (~16 s on 2 cores)

ROOT = Path(__file__).resolve().parents[2]
PROJECT = ROOT / "tests" / "fixtures" / "greeter"
MAX_MB = 150  # the whole virtualenv, Python's own pip included (`pip install hera`: 44 MB)
# What the LLM steps need (the `llm` extra) and what the SDK must never pull in.
HEAVY = {
    "torch", "ray", "mlflow", "mlflow-skinny", "transformers", "peft", "deepspeed", "great-expectations", "boto3",
    "botocore", "pandas", "numpy", "triton", "accelerate", "pyarrow", "scipy",
}  # fmt: skip


@pytest.fixture(scope="module")
def bare(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The python of a fresh virtualenv holding only `pip install <this checkout>` (built from a copy: an in-tree
    build would leave build/ and egg-info in the checkout)."""
    folder = tmp_path_factory.mktemp("bare")
    source = folder / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    shutil.copytree(ROOT / "eksflow", source / "eksflow", ignore=shutil.ignore_patterns("__pycache__"))
    venv.create(folder / "venv", with_pip=True)
    python = folder / "venv" / "bin" / "python"
    install = [str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q", str(source)]
    done = subprocess.run(install, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return python


def in_bare(python: Path, *args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """Run the bare virtualenv's python with this process's environment minus any path into the dev one."""
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run(
        [str(python), *args], cwd=cwd, env={**clean, **env}, capture_output=True, text=True, timeout=300, check=False
    )


def test_the_bare_install_is_light_and_holds_no_ml_library(bare):
    listed = in_bare(bare, "-m", "pip", "list", "--format=json", cwd=ROOT)
    installed = {d["name"].lower() for d in json.loads(listed.stdout)}
    assert "eksflow" in installed and "hera" in installed
    assert sorted(installed & HEAVY) == []
    assert not any(name.startswith(("nvidia-", "cuda-")) for name in installed), sorted(installed)
    venv_root = bare.parents[1]
    size_mb = sum(f.stat().st_size for f in venv_root.rglob("*") if f.is_file() and not f.is_symlink()) / 2**20
    assert size_mb <= MAX_MB, f"{size_mb:.0f} MB"


def test_every_sdk_module_imports_with_the_bare_install(bare):
    probe = (
        "import importlib, json, pkgutil, sys, eksflow\n"
        "names = [m.name for m in pkgutil.walk_packages(eksflow.__path__, 'eksflow.')]\n"
        # eksflow's LLM steps: their contracts (what a pipeline imports), not what runs them (torch at the top)
        "names = [n for n in names if not n.startswith('eksflow.llm.steps.') or n.count('.') == 3]\n"
        "for name in names:\n    importlib.import_module(name)\n"
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))"
    )
    done = in_bare(bare, "-c", probe, cwd=bare.parent)
    assert done.returncode == 0, done.stderr[-3000:]
    loaded = set(json.loads(done.stdout.splitlines()[-1]))
    assert sorted(loaded & {name.replace("-", "_") for name in HEAVY}) == []


def test_the_user_project_renders_strictly_and_runs_with_the_bare_install(bare, tmp_path, argo_validator):
    rendered = in_bare(bare, "-m", "pipelines.hello", "render", cwd=PROJECT)
    assert rendered.returncode == 0, rendered.stderr
    assert errors(argo_validator("Workflow"), yaml.safe_load(rendered.stdout)) == []
    ran = in_bare(bare, "-m", "pipelines.hello", "run", "--state-dir", str(tmp_path), "--set", "who=Grace", cwd=PROJECT)
    assert ran.returncode == 0, ran.stderr[-3000:]
    (run,) = (tmp_path / "runs").iterdir()
    status = json.loads((run / "status.json").read_text())["status"]
    assert status["phase"] == "Succeeded"
    lines = [p["value"] for n in status["nodes"].values() for p in n.get("outputs", {}).get("parameters", [])]
    assert "Hello, Grace! / Bonjour, Grace!" in lines


@pytest.mark.parametrize("pipeline", ["llama_lora", "lora_sweep", "champion_check"])
def test_the_llm_pipelines_render_and_plan_without_their_steps_runtime(bare, pipeline, argo_validator):
    """Authoring, rendering and planning the LLM pipelines needs the SDK only: the `llm` extra is the steps'."""
    rendered = in_bare(bare, f"pipelines/{pipeline}.py", "render", cwd=ROOT, PYTHONPATH=str(ROOT))
    assert rendered.returncode == 0, rendered.stderr[-3000:]
    assert errors(argo_validator("Workflow"), yaml.safe_load(rendered.stdout)) == []
    planned = in_bare(bare, f"pipelines/{pipeline}.py", "plan", cwd=ROOT, PYTHONPATH=str(ROOT))
    assert planned.returncode == 0, planned.stderr[-3000:]
