"""Running the project's commands as a user does: `python <args>` from the repository's root, output captured."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def python(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """`python <args>` in `cwd`; never raises for its exit code (the tests read it)."""
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False)
