"""The make targets run what README.md says they run."""

import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TAKES_A_VALUE = {"-m", "-n", "-k", "-p", "--maxprocesses"}  # pytest options whose value is the next word


def pytest_paths(target: str) -> list[str]:
    """The paths `make <target>` hands pytest (none: pytest's testpaths, every test folder)."""
    dry = subprocess.run(
        ["make", "-n", "--no-print-directory", target], cwd=ROOT, capture_output=True, text=True, check=True
    )
    (command,) = [shlex.split(line) for line in dry.stdout.splitlines() if " -m pytest " in line]
    words, paths = iter(command[command.index("pytest") + 1 :]), []
    for word in words:
        if word in TAKES_A_VALUE:
            next(words)
        elif not word.startswith("-"):
            paths.append(word)
    return paths


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_make_test_fast_runs_the_unit_and_contract_tests_only():
    """README: `make test-fast  # unit + contract only`; an e2e module not marked slow is make test's."""
    assert sorted(pytest_paths("test-fast")) == ["tests/contract", "tests/unit"]
