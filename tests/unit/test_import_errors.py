"""A pipeline file whose config class has a bad default of its own: one line naming where, and exit 2.

The defaults are built when the file is imported, before `main()` runs, so pydantic's ValidationError used to end
the command in a traceback (issue 55). The user project here is the LLM guide's (tests/fixtures/text2sql), with a
threshold its own metric can never meet written into its config class.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROJECT = ROOT / "tests" / "fixtures" / "text2sql"
PIPELINE = Path("pipelines") / "text2sql.py"


def user_project(tmp_path: Path, written: str, instead: str) -> Path:
    project = tmp_path / "text2sql"
    shutil.copytree(PROJECT, project, ignore=shutil.ignore_patterns("__pycache__"))
    source = (project / PIPELINE).read_text(encoding="utf-8")
    assert written in source
    (project / PIPELINE).write_text(source.replace(written, instead), encoding="utf-8")
    return project


def render(project: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # eksflow from this checkout; the project is the working folder
    return subprocess.run(
        [sys.executable, "-m", "pipelines.text2sql", "render"],
        cwd=project, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("instead", "problem"),
    [
        (
            'Threshold(metric="same_rows", value=1.5)',
            "EvaluateSettings.thresholds: threshold same_rows >= 1.5 can never hold: same_rows is from 0 to 1",
        ),
        (
            'Threshold(metric="same_rowz", value=0.5)',
            "EvaluateSettings.thresholds: threshold on unknown metric 'same_rowz'",
        ),
    ],
    ids=["unmeetable", "unknown-metric"],
)
def test_a_bad_threshold_in_the_config_class_default_is_one_line_naming_its_line(tmp_path, instead, problem):
    project = user_project(tmp_path, 'Threshold(metric="same_rows", value=0.5)', instead)
    done = render(project)
    line = next(n for n, text in enumerate((project / PIPELINE).read_text().splitlines(), 1) if "evaluate:" in text)
    assert done.returncode == 2 and not done.stdout, done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith(f"config error: {PIPELINE} line {line}: {problem}"), done.stderr


def test_other_errors_at_import_keep_their_traceback(tmp_path):
    project = user_project(tmp_path, "class Text2SqlConfig(", "1 / 0\n\n\nclass Text2SqlConfig(")
    done = render(project)
    assert done.returncode == 1 and "Traceback" in done.stderr and "ZeroDivisionError" in done.stderr
