"""Declaring a custom task metric: `@task_metric` marks a function of your module as one a config may name.

    from eksflow.runtime import task_metric

    @task_metric
    def starts_alike(answer: str, reference: str) -> float:
        return float(answer[:3] == reference[:3])

A config names it `package.module:starts_alike` (`evaluate.task_metrics`). A config is text anyone who can submit a run
may write, and importing a module runs its top level (`mlflow.__main__` runs MLflow's command line), so a name is
checked on the file system before anything is imported (`project_module`): the module must be a file of one of the
project's own packages, a folder with `__init__.py` in the project root (`project_root`): the folder holding the
pipeline's top-level package while a pipeline file's command line checks its config (eksflow.cli calls `use_project`),
and the working directory of a step, which is that folder in a local run and /app in the step's image (where a project
copies its packages), so rendering a config and running the step accept the same names. eksflow's own package, the
standard library and everything installed (site-packages) are refused before any import; so are `__main__` and
`__init__` modules, which run a program or a package again when imported. Only then is the module imported, and the name
accepted only if the module declared that very function here: whatever else it holds (a class, an undecorated helper, a
name rebound after the decorator ran) cannot be named.
"""

from __future__ import annotations

import importlib
import importlib.util
import site
import sys
import sysconfig
import types
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

Metric = Callable[[str, str], float]
M = TypeVar("M", bound=Metric)

_DECLARED: dict[str, Metric] = {}  # "module:function" -> the function the decorator saw
SDK_PACKAGE = "eksflow"  # its modules declare no metric, and some of them act when imported
_project: Path | None = None


def task_metric(function: M) -> M:
    """Declare `function(answer, reference) -> float in [0, 1]` (NaN: row not scored) a task metric; unchanged.

    It must be a plain function at the top level of its module, and this decorator the outermost one: the name a
    config uses is `<its module>:<its name>`, and the evaluate step checks that the module holds this very object.
    """
    qualname = getattr(function, "__qualname__", "")
    if not isinstance(function, types.FunctionType) or "." in qualname:
        raise TypeError(
            f"@task_metric applies to a function defined at the top level of a module, not {function!r}: "
            "a config names it as 'package.module:function'"
        )
    _DECLARED[f"{function.__module__}:{qualname}"] = function
    return function


def declared(reference: str) -> Metric | None:
    """The function a module declared with @task_metric under `module:function`, or None."""
    return _DECLARED.get(reference)


def use_project(root: Path) -> None:
    """Take `root` as the project whose packages may declare metrics (the pipeline's, while its config is checked)."""
    global _project  # noqa: PLW0603 (one project per process: the pipeline file's, or the step's working directory)
    _project = root


def project_root() -> Path:
    """The project whose packages may declare metrics: the one `use_project` named, else the working directory."""
    return _project or Path.cwd()


def project_module(module_name: str, root: Path) -> types.ModuleType:
    """Module `module_name` (dotted) imported only if it is a file of a package in project root `root`.

    ValueError, before anything is imported, when it is not; ValueError too when its import fails.
    """
    parts = module_name.split(".")
    if parts[0] == SDK_PACKAGE:
        raise ValueError(f"{module_name} is part of eksflow, not of this project's packages")
    if parts[0] in sys.stdlib_module_names:
        raise ValueError(f"{module_name} is in the standard library, not in this project's packages")
    path = _module_file(parts, root.resolve())
    if path is None:
        raise ValueError(f"{module_name} is not in this project's packages (folders with __init__.py in {root})")
    if installed := next((folder for folder in _installed_folders() if path.is_relative_to(folder)), None):
        raise ValueError(f"{module_name} is installed in {installed}, not in this project's packages")
    if any(part.startswith("__") for part in parts):
        raise ValueError(f"{module_name} is a __main__ or __init__ module, which runs a program when imported")
    # The import binds the top-level name through sys.path: it must reach the project's package, not an installed
    # one of the same name. A top-level name is looked up without importing anything.
    top = sys.modules.get(parts[0])
    spec = top.__spec__ if top is not None else importlib.util.find_spec(parts[0])
    origin = Path(spec.origin).resolve() if spec is not None and spec.origin else None
    if origin != (root / parts[0] / "__init__.py").resolve():
        raise ValueError(f"{parts[0]} is imported from {origin or 'nowhere'}, not from the project in {root}")
    try:
        module = importlib.import_module(module_name)
    except Exception as err:  # the module's top level raised: bad config, said in one line, not a traceback
        raise ValueError(f"importing {module_name} failed: {type(err).__name__}: {err}") from err
    if Path(module.__file__ or "").resolve() != path:
        raise ValueError(f"{module_name} was imported from {module.__file__}, not from {path}")
    return module


def _module_file(parts: list[str], root: Path) -> Path | None:
    """The file of module `parts` in `root`, through regular packages only (symlinks resolved), or None."""
    folder = root
    for part in parts[:-1]:
        folder = folder / part
        if not (folder / "__init__.py").is_file():
            return None
    package = folder / parts[-1] / "__init__.py"
    # A module file at the top of the root (setup.py, conftest.py) is in no package: scripts live there.
    candidates = [package] if len(parts) == 1 else [package, folder / f"{parts[-1]}.py"]
    found = next((candidate.resolve() for candidate in candidates if candidate.is_file()), None)
    return found if found is not None and found.is_relative_to(root) else None  # no symlink out of the project


def _installed_folders() -> list[Path]:
    """Where the standard library and installed distributions live (venv and base interpreter, user site)."""
    paths = [sysconfig.get_path(key) for key in ("stdlib", "platstdlib", "purelib", "platlib")]
    paths += [*site.getsitepackages(), site.getusersitepackages()]
    return [Path(p).resolve() for p in dict.fromkeys(paths) if p]
