"""No test asserts on wall-clock time: on a loaded 2-core machine any bound on how long something took is a flake.

Found statically: an `assert` comparing an elapsed time (a clock reading minus another, written in the assert or
named first, `elapsed = time.monotonic() - started`). A deadline that bounds a wait (`assert time.monotonic() <
deadline`) fails only when the awaited thing never happens, and is not one. Benchmarks measure time (bench/), as
ratios against a peer in the same run.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CLOCKS = {"time", "time_ns", "monotonic", "monotonic_ns", "perf_counter", "perf_counter_ns"}


def is_elapsed(node: ast.AST) -> bool:
    """`<clock>() - x`: an elapsed time."""
    return (
        isinstance(node, ast.BinOp)
        and isinstance(node.op, ast.Sub)
        and isinstance(node.left, ast.Call)
        and isinstance(node.left.func, ast.Attribute | ast.Name)
        and (node.left.func.attr if isinstance(node.left.func, ast.Attribute) else node.left.func.id) in CLOCKS
    )


def elapsed_asserts(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    found = []
    for function in [tree, *(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef))]:
        named = {
            target.id
            for node in ast.walk(function)
            if isinstance(node, ast.Assign) and is_elapsed(node.value)
            for target in node.targets
            if isinstance(target, ast.Name)
        }
        for node in ast.walk(function):
            if not isinstance(node, ast.Assert):
                continue
            for compare in (n for n in ast.walk(node.test) if isinstance(n, ast.Compare)):
                operands = [compare.left, *compare.comparators]
                if any(is_elapsed(o) or (isinstance(o, ast.Name) and o.id in named) for o in operands):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_test_asserts_how_long_something_took():
    found = sorted({line for path in sorted((ROOT / "tests").rglob("*.py")) for line in elapsed_asserts(path)})
    assert found == [], "assert what the user needs (an outcome, an order, a message), not a duration"
