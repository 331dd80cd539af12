"""One way to do a thing: no function or method of eksflow/ is written twice.

Two definitions with the same arguments and the same body (the docstring aside) drift apart at the first fix that
reaches one of them; the second becomes an import of the first. One-liners (under MIN_NODES syntax nodes: a
property, a delegation) may repeat.
"""

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MIN_NODES = 25


def body_without_docstring(function: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.stmt]:
    first = function.body[0]
    has_doc = (
        isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str)
    )
    return function.body[1:] if has_doc else function.body


def test_no_function_is_written_twice():
    written: defaultdict[str, list[str]] = defaultdict(list)
    for path in sorted((ROOT / "eksflow").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for scope in [tree, *(node for node in ast.walk(tree) if isinstance(node, ast.ClassDef))]:
            for node in scope.body:
                if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    continue
                body = ast.Module(body=body_without_docstring(node), type_ignores=[])
                if sum(1 for _ in ast.walk(body)) >= MIN_NODES:
                    written[ast.dump(node.args) + ast.dump(body)].append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert [places for places in written.values() if len(places) > 1] == []
