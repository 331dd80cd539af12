"""No dead code: every function and method of eksflow/ is named somewhere in the project.

A name counts as used when any Python file of the project (the SDK, pipelines, tests, scripts, benchmarks, image
tooling) reads it: as a name, an attribute, an imported name, or a string that is a whole (dotted) name, as
`getattr(section, "local_problems")` and `"module:function"` references are. Decorated functions (validators,
properties, registered hooks) and dunder methods are called by their framework, as are the few below that a
library calls by name.
"""

import ast
import functools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROJECT = ("eksflow", "pipelines", "tests", "scripts", "bench", "images")
CALLED_BY_THEIR_LIBRARY = {
    "async_pre_call_hook": "LiteLLM's CustomLogger, before routing (eksflow/llm/steps/common/litellm_routes.py)",
    "async_pre_call_deployment_hook": "LiteLLM's CustomLogger, after routing (the same module)",
    "extra_repr": "torch.nn.Module's repr (eksflow/llm/steps/train/dropout.py)",
    "log_message": "http.server's request log, silenced (eksflow/local/trainer_status_server.py)",
    "handle_error": "socketserver's report of a failed connection, silenced (the same module)",
}
WHOLE_NAME = re.compile(r"[A-Za-z_][\w.:]*")


def python_files(*folders: str) -> list[Path]:
    return sorted(path for folder in folders for path in (ROOT / folder).rglob("*.py"))


@functools.cache
def parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), str(path))


def names_used() -> set[str]:
    used: set[str] = set()
    for path in python_files(*PROJECT):
        tree = parsed(path)
        # an f-string's literal parts are text, not names: f"ping{suffix}" uses no `ping`
        formatted = {id(part) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for part in node.values}
        for node in ast.walk(tree):
            if isinstance(node, ast.Name):
                used.add(node.id)
            elif isinstance(node, ast.Attribute):
                used.add(node.attr)
            elif isinstance(node, ast.alias):
                used.add(node.name.rpartition(".")[2])
            elif isinstance(node, ast.Constant) and id(node) not in formatted and is_whole_name(node.value):
                used.update(re.split(r"[.:]", node.value))
    return used


def is_whole_name(value: object) -> bool:
    return isinstance(value, str) and WHOLE_NAME.fullmatch(value) is not None


def defined_functions() -> list[tuple[str, str]]:
    """(where, name) of each undecorated, non-dunder function or method at a module's or class's top."""
    found = []
    for path in python_files("eksflow"):
        tree = parsed(path)
        bodies = [tree.body, *(node.body for node in ast.walk(tree) if isinstance(node, ast.ClassDef))]
        for body in bodies:
            for node in body:
                if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) or node.decorator_list:
                    continue
                if not (node.name.startswith("__") and node.name.endswith("__")):
                    found.append((f"{path.relative_to(ROOT)}:{node.lineno}", node.name))
    return found


def test_every_function_of_the_sdk_is_used():
    used = names_used() | set(CALLED_BY_THEIR_LIBRARY)
    unused = [f"{where} {name}" for where, name in defined_functions() if name not in used]
    assert unused == [], f"dead code (remove it, or say in CALLED_BY_THEIR_LIBRARY who calls it): {unused}"
