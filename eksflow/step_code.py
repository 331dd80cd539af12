"""The code a step's result depends on: its module and the project modules it imports, found without importing them.

A memo key hashes this code (templates.template_fingerprint), so an edit churns the keys of exactly the steps
that run the edited module, not every step beside it. The project is the eksflow distribution and the step's own
top-level package (a user's `steps`); third-party libraries are left out: the image pins them.

Imports are read from the source with `ast`, wherever they stand: heavy imports live inside the functions that run
them, so a function-level import counts as much as a module-level one. What follows an import: `import a.b`,
`from a import b` (the module a.b when there is one), relative imports, a module's packages (their `__init__` runs
first), a package step's `__main__` (what `python -m` runs), and a name a package loads on first use through its
`_PUBLIC` map (eksflow's flat namespace: `from eksflow import run_step` runs eksflow.runtime.args). Imports under
`if TYPE_CHECKING:` never run and are left out.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import NamedTuple

SDK_PACKAGE = "eksflow"
SDK_FOLDER = Path(__file__).resolve().parent
LAZY_NAMES = "_PUBLIC"  # a package's map of the names it loads on first use to the modules defining them


class ImportStatement(NamedTuple):
    """`import module` (names None), or `from <level dots><module> import names`."""

    level: int
    module: str | None
    names: tuple[str, ...] | None


class Source(NamedTuple):
    """What a module's text says for its code: the imports that run, and its `_PUBLIC` map."""

    imports: tuple[ImportStatement, ...]
    lazy_names: tuple[tuple[str, str], ...]


def step_sources(step: ModuleType) -> list[str]:
    """The name and source text of every module the step runs from the project, in module-name order."""
    project = ProjectModules(step)
    found: dict[str, str] = {}
    pending = [step.__name__, *([f"{step.__name__}.__main__"] if hasattr(step, "__path__") else [])]
    while pending:
        name = pending.pop()
        if name in found:
            continue
        path = project.file_of(name)
        if path is None:
            continue
        text = path.read_text(encoding="utf-8")
        found[name] = text
        pending += packages_of(name)
        pending += project.imports_of(name, read(text), is_package=path.name == "__init__.py")
    return [f"{name}\n{found[name]}" for name in sorted(found)]


@functools.lru_cache(maxsize=4096)
def read(text: str) -> Source:
    """The imports and lazy names of a module's source, parsed once per text (every task of a step shares them)."""
    tree = ast.parse(text)
    imports = []
    for node in run_time_nodes(tree):
        if isinstance(node, ast.Import):
            imports += [ImportStatement(0, alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            imports.append(ImportStatement(node.level, node.module, tuple(alias.name for alias in node.names)))
    lazy = next((found for node in tree.body if (found := lazy_map(node))), {})
    return Source(tuple(imports), tuple(lazy.items()))


def packages_of(name: str) -> list[str]:
    """`a.b.c` -> `a`, `a.b`: the packages Python imports before the module."""
    parts = name.split(".")
    return [".".join(parts[:depth]) for depth in range(1, len(parts))]


class ProjectModules:
    """Where the project's modules are (eksflow's and the step's top-level package's), read from their folders."""

    def __init__(self, step: ModuleType) -> None:
        self.roots = {SDK_PACKAGE: SDK_FOLDER}
        parts = step.__name__.split(".")
        step_file = Path(getattr(step, "__file__", None) or "")
        if parts[0] != SDK_PACKAGE and step_file.suffix == ".py":
            is_package = step_file.name == "__init__.py"
            # a top-level module is its own root; a package's root is its top folder, as many levels up as it is deep
            root = step_file if len(parts) == 1 and not is_package else step_file.parent
            for _ in range(len(parts) - (1 if is_package else 2)):
                root = root.parent
            self.roots[parts[0]] = root.resolve()
        # For one step's walk, whose modules are asked for again and again: where each is, and a package's _PUBLIC.
        self._files: dict[str, Path | None] = {}
        self._lazy: dict[str, dict[str, str]] = {}

    def file_of(self, name: str) -> Path | None:
        """The source file of module `name` when it is the project's, else None."""
        if name not in self._files:
            self._files[name] = self._find(name)
        return self._files[name]

    def _find(self, name: str) -> Path | None:
        top, *rest = name.split(".")
        root = self.roots.get(top)
        if root is None:
            return None
        if root.suffix == ".py":
            return root if not rest else None
        folder = root.joinpath(*rest)
        candidates = [folder / "__init__.py", *([folder.with_suffix(".py")] if rest else [])]
        return next((candidate for candidate in candidates if candidate.is_file()), None)

    def imports_of(self, name: str, source: Source, *, is_package: bool) -> list[str]:
        """The modules `source` (of module `name`) imports when it runs."""
        package = name if is_package else name.rpartition(".")[0]
        found = []
        for statement in source.imports:
            if statement.names is None:
                found.append(statement.module or "")
                continue
            base = absolute(package, statement.level, statement.module)
            found.append(base)
            found += [self.imported_name(base, imported) for imported in statement.names if imported != "*"]
        return found

    def imported_name(self, package: str, name: str) -> str:
        """What `from package import name` runs: the submodule `name`, or the module `package` loads it from."""
        if self.file_of(f"{package}.{name}") is not None:
            return f"{package}.{name}"
        if package not in self._lazy:
            path = self.file_of(package)
            self._lazy[package] = dict(read(path.read_text(encoding="utf-8")).lazy_names) if path is not None else {}
        return self._lazy[package].get(name, package)


def lazy_map(node: ast.stmt) -> dict[str, str]:
    """`_PUBLIC = {"name": "module", ...}` as a dict; anything else as {}."""
    target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None
    if isinstance(node, ast.AnnAssign):
        target = node.target
    value = getattr(node, "value", None)
    if not (isinstance(target, ast.Name) and target.id == LAZY_NAMES and isinstance(value, ast.Dict)):
        return {}
    pairs = zip(value.keys, value.values, strict=True)
    return {
        key.value: module.value
        for key, module in pairs
        if isinstance(key, ast.Constant)
        and isinstance(key.value, str)
        and isinstance(module, ast.Constant)
        and isinstance(module.value, str)
    }


def absolute(package: str, level: int, module: str | None) -> str:
    """The module a `from` import names: in a module of package a.b.c, `from ..x import y` names a.b.x."""
    if level == 0:
        return module or ""
    parts = package.split(".")
    base = parts[: len(parts) - (level - 1)] if level - 1 < len(parts) else []
    return ".".join([*base, *([module] if module else [])])


def run_time_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every statement of `tree` except the bodies of `if TYPE_CHECKING:` (imports for annotations, never run).

    Statements only (and the except and case clauses holding them): an import is a statement, so the expressions,
    most of a tree's nodes, are never visited.
    """
    for child in ast.iter_child_nodes(tree):
        if not isinstance(child, _HOLDS_STATEMENTS):
            continue
        if isinstance(child, ast.If) and ast.unparse(child.test).endswith("TYPE_CHECKING"):
            for inner in child.orelse:
                yield inner
                yield from run_time_nodes(inner)
            continue
        yield child
        yield from run_time_nodes(child)


_HOLDS_STATEMENTS = (ast.stmt, ast.excepthandler, ast.match_case)
