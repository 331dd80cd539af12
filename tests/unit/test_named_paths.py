"""Every path of this repository that the README, the docs and the code's docstrings and comments name exists.

A module moved or renamed leaves its old path in prose that no import checks: this test reads them all. Paths
under eksflow/, docs/, scripts/, bench/, images/, requirements/ and workflow-templates/ are checked everywhere; the
docs also describe a user's own project (its pipelines/ and data/), so pipelines/ and tests/ are checked in the
README only, where they name this repository's files.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EVERYWHERE = ("eksflow", "docs", "scripts", "bench", "images", "requirements", "workflow-templates")
README_ONLY = ("pipelines", "tests")
_PATH = r"(?<![\w./-])((?:{})/[\w./-]*\w)"
_VALUE = re.compile(r"""["'][^"'\n]*$""")  # inside a string literal that started on the line: a value, not prose


def named_paths(text: str, tops: tuple[str, ...]) -> set[str]:
    """Paths under the folders `tops` that `text` names (wildcards and placeholders skipped)."""
    found = set()
    for line in text.splitlines():
        for match in re.finditer(_PATH.format("|".join(map(re.escape, tops))), line):
            if not any(ch in match.group(1) for ch in "*<>{}$") and not _VALUE.search(line[: match.start()]):
                found.add(match.group(1).rstrip("."))
    return found


def sources() -> list[str]:
    listed = subprocess.run(["git", "ls-files", "*.md", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True)
    return [f for f in listed.stdout.split() if f.endswith(".md") or f.startswith(("eksflow/", "pipelines/"))]


def test_every_repository_path_the_docs_and_the_code_name_exists():
    missing = []
    for source in sources():
        tops = EVERYWHERE + (README_ONLY if source == "README.md" else ())
        text = (ROOT / source).read_text(encoding="utf-8", errors="replace")
        missing += [f"{source}: {path}" for path in sorted(named_paths(text, tops)) if not (ROOT / path).exists()]
    assert not missing, "\n".join(missing)


def test_a_path_in_prose_is_found_and_a_string_value_is_not():
    assert named_paths("see eksflow/local/fleet.py.", ("eksflow",)) == {"eksflow/local/fleet.py"}
    assert named_paths('KEY = "eksflow/train/start"  # a store key', ("eksflow",)) == set()
    assert named_paths("each `eksflow/*/x.py` and <eksflow/{name}.py>", ("eksflow",)) == set()
