"""Manifests for local-executor tests, built as Hera renders them, and a run that records what it printed."""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from eksflow.local import RunResult, run_workflow

# Snippets for `python -c CODE arg...`; sys.argv[1:] are the container args.
APPEND = "import sys; open(sys.argv[1], 'a').write(sys.argv[2] + '\\n')"
WRITE_OUTPUT = (
    "import os, sys; os.makedirs(os.path.dirname(sys.argv[1]), exist_ok=True);open(sys.argv[1], 'w').write(sys.argv[2])"
)
EXIT_WITH = "import sys; open(sys.argv[1], 'a').write('x\\n'); sys.exit(int(sys.argv[2]))"


def container(name: str, code: str, *args: str, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "container": {"image": "python:3.11", "command": ["python", "-c", code], "args": list(args)},
        **extra,
    }


def task(name: str, template: str, depends: str | None = None, **extra: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"name": name, "template": template, **extra}
    if depends:
        spec["depends"] = depends
    return spec


def workflow(tasks: list[dict[str, Any]], templates: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Workflow",
        "metadata": {"generateName": "test-"},
        "spec": {"entrypoint": "main", "templates": [*templates, {"name": "main", "dag": {"tasks": tasks}}], **spec},
    }


@dataclass
class Outcome(RunResult):
    output: str = ""  # what the run printed (plain mode: one line per phase change)


def run(manifest: dict[str, Any], tmp_path: Path, **kwargs: Any) -> Outcome:
    out = io.StringIO()
    result = run_workflow(manifest, tmp_path / "state", cwd=tmp_path, console=Console(file=out, width=200), **kwargs)
    return Outcome(**vars(result), output=out.getvalue())


def phases(result: RunResult) -> dict[str, str]:
    return {name: node.phase for name, node in result.nodes.items()}


def lines(path: Path) -> list[str]:
    return Path(path).read_text().splitlines()


def dag(name: str, tasks: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"name": name, "dag": {"tasks": tasks}, **extra}


def params(**values: str) -> dict[str, Any]:
    return {"parameters": [{"name": k, "value": v} for k, v in values.items()]}


def inputs(*names: str) -> dict[str, Any]:
    return {"parameters": [{"name": n} for n in names]}


def outputs(*names: str, folder: str = "/tmp/outputs") -> dict[str, Any]:
    return {"parameters": [{"name": n, "valueFrom": {"path": f"{folder}/{n}"}} for n in names]}
