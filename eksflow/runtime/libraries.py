"""A library a step needs that is not installed: bad input (exit 2, never retried), said in one line with the fix.

`pip install eksflow` is the light SDK; eksflow's LLM steps (eksflow.llm) run on the libraries of the `llm` extra
(torch, Ray, MLflow, ...). Without them a step's first import of one raised ModuleNotFoundError, a traceback that
exited 1 and was retried, though no retry installs anything. Now `run_step` turns it into one line naming the
library and the extra that brings it (`missing_library`), and the local `run` checks the extra of every step it is
about to run before the first task (`check_installed`). Which extra lists which library is read from eksflow's own
installed metadata (its Requires-Dist), never restated here.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import sys
from collections.abc import Iterable

from eksflow.errors import EXIT_BAD_INPUT, EksflowError

DISTRIBUTION = "eksflow"
EXTRA_OF_PACKAGE = {"eksflow.llm": "llm"}  # the modules of a package run on the libraries of the extra named here
EXTRA_MARKER = re.compile(r"""extra\s*==\s*['"]([^'"]+)['"]""")
REQUIREMENT_NAME = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


class MissingLibraryError(EksflowError):
    """A library the steps need is not installed here; the message names it and the `pip install` that brings it."""

    label = "error"
    exit_code = EXIT_BAD_INPUT


def extra_libraries() -> dict[str, list[str]]:
    """Each extra's libraries as top-level module names, read from eksflow's installed metadata ({} without it)."""
    try:
        requirements = importlib.metadata.requires(DISTRIBUTION) or []
    except importlib.metadata.PackageNotFoundError:  # a source tree on the path, never installed: nothing to say
        return {}
    found: dict[str, list[str]] = {}
    for requirement in requirements:
        spec, _, marker = requirement.partition(";")
        extra, name = EXTRA_MARKER.search(marker), REQUIREMENT_NAME.match(spec)
        if extra and name:
            found.setdefault(extra.group(1), []).append(module_name(name.group(1)))
    return found


def module_name(distribution: str) -> str:
    """The top-level module a distribution installs, by convention: great-expectations -> great_expectations."""
    return re.sub(r"[-_.]+", "_", distribution).lower()


def extra_of(module: str) -> str | None:
    """The extra whose libraries `module` (a step) runs on; None for a module of no extra (the user's own steps)."""
    return next((extra for package, extra in EXTRA_OF_PACKAGE.items() if module.startswith(f"{package}.")), None)


def missing_library(error: ModuleNotFoundError, step: str) -> str:
    """The line a step prints for `error`: the library, and the extra that brings it.

    The extra is the one listing the library, else the step's own: a missing library of a library the extra
    installs is fixed by installing the extra again.
    """
    if step == "__main__":  # `python -m <step>` runs the step's module as __main__: its spec keeps the name
        step = getattr(getattr(sys.modules.get("__main__"), "__spec__", None), "name", step)
    missing = (error.name or "").partition(".")[0]
    extras = [
        extra
        for extra, names in extra_libraries().items()
        if any(name == missing or name.startswith(f"{missing}_") for name in names)  # optimum-neuron: optimum.neuron
    ]
    extras = extras or ([extra] if (extra := extra_of(step)) else [])
    fix = " or ".join(f'pip install "{DISTRIBUTION}[{extra}]"' for extra in extras)
    where = f"{step} needs the library {missing!r}, which is not installed in this environment"
    return f"{where}: {fix}" if fix else f"{where} ({error}): install it where the step runs (its image)"


def check_installed(steps: Iterable[str]) -> None:
    """MissingLibraryError naming every library of the steps' extras that this environment lacks, in one line.

    A library is looked for, never imported (importing torch and Ray would cost seconds before the first task).
    """
    libraries = extra_libraries()
    needed: dict[str, list[str]] = {}
    for step in sorted(set(steps)):
        if (extra := extra_of(step)) is not None:
            needed.setdefault(extra, []).append(step.rpartition(".")[2])
    for extra, names in needed.items():
        missing = [name for name in libraries.get(extra, []) if importlib.util.find_spec(name) is None]
        if missing:
            steps_need = f"the step {names[0]} needs" if len(names) == 1 else f"the steps {', '.join(names)} need"
            are = "is" if len(missing) == 1 else "are"
            raise MissingLibraryError(
                f"{steps_need} the libraries of {DISTRIBUTION}[{extra}], and {', '.join(missing)} {are} not installed "
                f'in this environment: pip install "{DISTRIBUTION}[{extra}]"'
            )
