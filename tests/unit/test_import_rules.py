"""The dependency rules that keep eksflow easy to change, enforced rather than hoped for.

- Inside the SDK imports run one way, down the layers of LAYERS: a module imports only its own unit (a module, or
  a subpackage: local, runtime, launchers) and the units below it, wherever the import statement stands (a
  function-local import is no way around a cycle). Imports for annotations only (`if TYPE_CHECKING:`) are exempt.
- No two modules import each other, directly or through others (the steps included), wherever the imports stand.
- The SDK (every module of eksflow/, the LLM library's pipeline side and its steps' contracts included) and
  rendering a pipeline (what `render`, `plan` and `submit` do) import none of the heavy ML or cloud libraries:
  `pip install eksflow` holds none (tests/contract/test_bare_install.py).
- eksflow's LLM steps (eksflow/llm/steps) import neither hera nor eksflow's authoring layer nor the LLM library's
  pipeline side (eksflow.llm.pipeline, eksflow.llm.serving): a step image needs only eksflow.runtime (and
  eksflow.errors, the exit codes and the exception root it builds on), the steps themselves, and
  eksflow.llm.engines (standard library only: where the serving engines' interpreters are).
- A step's contract (what a pipeline imports to wire it) is light too.
- The LiteLLM proxy's callback (eksflow/llm/steps/common/litellm_routes.py) imports nothing of this project.
- What the steps share (eksflow/llm/steps/common) imports no step, and what the pipelines share (pipelines/_*.py)
  imports no pipeline: shared code sits below what uses it, so a step or pipeline changes without moving it.
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
PIPELINES = sorted(p.stem for p in (ROOT / "pipelines").glob("*.py") if not p.stem.startswith("_"))
STEPS = ROOT / "eksflow" / "llm" / "steps"
STEP_FILES = sorted(STEPS.rglob("*.py"))
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
        "from eksflow.config import config_type\n"
        "from eksflow.config import load_config\n"
        "from eksflow.plan import check\n"
        "from eksflow.render import manifest\n"
        "built = p.build(load_config(config_type(p.build)))\n"
        "manifest(built); check(built)\n"
    )
    assert sorted(set(loaded_after(code)) & set(HEAVY)) == []


def test_no_module_of_the_sdk_imports_anything_heavy():
    """The LLM library's steps import their libraries where they need them; its pipeline side is light too."""
    code = (
        "import importlib, pkgutil, eksflow\n"
        "for m in pkgutil.walk_packages(eksflow.__path__, 'eksflow.'):\n"
        "    if not m.name.startswith('eksflow.llm.steps.') or m.name.count('.') == 3 and m.ispkg:\n"
        "        importlib.import_module(m.name)\n"
    )
    assert sorted(set(loaded_after(code)) & set(HEAVY)) == []


# The SDK's units, lowest first: each may import only those before it (and itself).
LAYERS = (
    "eksflow.errors",  # the exception root and exit codes
    "eksflow.names",
    "eksflow.cron",
    "eksflow.kinds",  # how values travel
    "eksflow.profiles",  # accelerator profiles
    "eksflow.runtime",  # what a step image needs
    "eksflow.manifests",  # Kubernetes objects as manifest text
    "eksflow.local",  # the local executor
    "eksflow.argo_client",
    "eksflow.argo_server",
    "eksflow.submit",
    "eksflow.config_file",  # reading a config file
    "eksflow.import_errors",  # a config class's bad default, refused in one line while its module imports
    "eksflow.config",  # the base config
    "eksflow.cluster",  # the `cluster` section and the launcher registry
    "eksflow.topology",  # cluster.topology: Kueue's podset annotation and Topology objects
    "eksflow.parameters",  # the rules a workflow parameter's values are held to (retry/resubmit -p)
    "eksflow.conditions",  # when= expressions
    "eksflow.sections",  # shared groups of arguments
    "eksflow.refs",  # values and tasks being wired
    "eksflow.pods",  # a task's pod options, checked by Kubernetes' rules
    "eksflow.pipeline",  # the DAG under construction
    "eksflow.step_code",  # the code a step runs, which its memo key hashes
    "eksflow.templates",  # task(): step templates
    "eksflow.resources",  # resource(): resource templates
    "eksflow.launchers",  # distributed(): a step across workers
    "eksflow.render",  # the Workflow, WorkflowTemplate, CronWorkflow
    "eksflow.plan",
    "eksflow.run",
    "eksflow.verbs",
    "eksflow.config_docs",
    "eksflow.cli",
    "eksflow",  # the flat public namespace, loading each name on first use
    "eksflow.llm",  # the LLM library (`eksflow[llm]`), written against the public names as a user's project is
)


def sdk_unit(module: str) -> str:
    """`eksflow.local.fleet` -> `eksflow.local`; `eksflow.templates` -> itself."""
    parts = module.split(".")
    return ".".join(parts[:2])


def sdk_imports(path: Path) -> set[str]:
    """The eksflow modules a file imports at run time: anywhere in it (a function's body too), relative imports
    resolved, except under `if TYPE_CHECKING:`."""
    tree = ast.parse(path.read_text(), str(path))
    typing_only = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING")
        for inner in ast.walk(node)
    }
    module = module_of(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.split(".")[0] == "eksflow"}
        elif isinstance(node, ast.ImportFrom):
            # `from .x import y` in package a.b is `from a.b.x import y`; each dot past the first goes one up
            above = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            base = ".".join([*above, *([node.module] if node.module else [])])
            if base.split(".")[0] == "eksflow":
                # `from eksflow.local import fleet` imports the module eksflow.local.fleet
                found |= {_module_or_package(base, alias.name) for alias in node.names}
    return found


def _module_or_package(package: str, name: str) -> str:
    folder = ROOT.joinpath(*package.split("."))
    is_module = (folder / f"{name}.py").is_file() or (folder / name / "__init__.py").is_file()
    return f"{package}.{name}" if is_module else package


SDK_FILES = sorted((ROOT / "eksflow").rglob("*.py"))


def module_of(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def test_every_sdk_unit_has_a_layer():
    units = {sdk_unit(module_of(path)) for path in SDK_FILES}
    assert sorted(units - set(LAYERS)) == [], "add the new module to LAYERS, above what it imports"


@pytest.mark.parametrize("path", SDK_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_sdk_imports_run_down_the_layers(path):
    unit = sdk_unit(module_of(path))
    if unit == "eksflow":  # the public namespace: names load lazily from every layer
        return
    level = LAYERS.index(unit)
    upward = sorted(
        name
        for name in sdk_imports(path)
        if sdk_unit(name) != unit and sdk_unit(name) in LAYERS and LAYERS.index(sdk_unit(name)) > level
    )
    assert upward == [], f"{path.relative_to(ROOT)} ({unit}) imports from layers above it: {upward}"


def test_no_import_cycle_between_sdk_modules():
    """Function-level imports count: one that closes a cycle only moves the cycle from import time to run time.

    One back edge is allowed: a package importing a module inside it (a step's contract loads its implementation in
    the hook that needs it, as train's `preflight` imports train.sizing, and the implementation imports the
    contract's Settings), since Python loads a package before any module inside it.
    """
    modules = {module_of(p): p for p in SDK_FILES}
    graph = {
        name: {
            m for m in sdk_imports(path) if m in modules and m not in (name, "eksflow") and not m.startswith(name + ".")
        }
        for name, path in modules.items()
        if name != "eksflow"
    }
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> list[str]:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path, node, nxt]
            if nxt not in state and (cycle := visit(nxt, [*path, node])):
                return cycle
        state[node] = 2
        return []

    for start in sorted(graph):
        if start not in state:
            cycle = visit(start, [])
            assert cycle == [], f"an import cycle: {' -> '.join(cycle)}"


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
    """eksflow/llm/steps/common/litellm_routes.py runs inside the LiteLLM proxy's virtualenv: no eksflow there."""
    found = imports(STEPS / "common" / "litellm_routes.py")
    assert [n for n in found if n.partition(".")[0] in ("eksflow", "steps", "pipelines")] == []


@pytest.mark.parametrize("path", STEP_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_steps_import_neither_hera_nor_the_authoring_layer(path):
    bad = []
    for name in imports(path):
        top, _, rest = name.partition(".")
        if top in ("hera", "pipelines") or (
            top == "eksflow"
            and not (rest.startswith(("runtime", "errors", "llm.steps", "llm.engines")) or rest in RUNTIME_NAMES)
        ):
            bad.append(name)
    assert bad == [], f"{path.relative_to(ROOT)} imports the authoring side: {bad}"


def test_step_contracts_are_light():
    contracts = sorted(
        {f"eksflow.llm.steps.{p.parent.name}" for p in STEPS.glob("*/__init__.py") if p.parent.name != "common"}
        | {f"eksflow.llm.steps.{p.stem}" for p in STEPS.glob("*.py") if p.stem != "__init__"}
    )
    loaded = loaded_after("\n".join(f"import {c}" for c in contracts))
    assert sorted(set(loaded) & set(HEAVY)) == []
    assert "hera" not in loaded


COMMON_FILES = sorted((STEPS / "common").glob("*.py"))


@pytest.mark.parametrize("path", COMMON_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_shared_step_code_imports_no_step(path):
    """A step imported by eksflow/llm/steps/common would load with every step that shares it, and could cycle."""
    steps = [
        name
        for name in imports(path)
        if name.startswith("eksflow.llm.steps.") and not name.startswith("eksflow.llm.steps.common")
    ]
    assert steps == [], f"{path.relative_to(ROOT)} imports steps: {steps}; move what it needs into steps/common"


SHARED_PIPELINE_FILES = sorted((ROOT / "pipelines").glob("_*.py"))


@pytest.mark.parametrize("path", SHARED_PIPELINE_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_shared_pipeline_code_imports_no_pipeline(path):
    """pipelines/_*.py serve every pipeline: what they need of one (its config type) is passed in."""
    found = [name for name in imports(path) if name.split(".")[0] == "pipelines"]
    pipelines = [name for name in found if not name.split(".")[1].startswith("_")]
    assert pipelines == [], f"{path.relative_to(ROOT)} imports pipelines: {pipelines}; pass in what it needs"
