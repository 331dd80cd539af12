"""The light install runs an LLM step: one line naming the missing library and `pip install "eksflow[llm]"`, exit 2.

The light install is made cheaply: this environment's site-packages seen through a folder of links that leaves
out the `llm` extra's libraries, on the path of an interpreter started without its site (`-S`), so they are not
there to find, as in `pip install eksflow` (tests/contract/test_bare_install.py installs that one for real).
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from eksflow.runtime.libraries import extra_libraries, missing_library

ROOT = Path(__file__).resolve().parents[2]
PIPELINE = """
from eksflow import Pipeline, PipelineConfig, main, name_field, task
from eksflow.llm.steps import champion


class ChampionConfig(PipelineConfig):
    name: str = name_field("champion-only")


def build(cfg: ChampionConfig) -> Pipeline:
    with Pipeline(cfg, title="the champion") as p:
        task(champion, tracking_uri="sqlite:////tmp/unused.db", model_name="m")
    return p


if __name__ == "__main__":
    main(build)
"""


@pytest.fixture(scope="module")
def light_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A PYTHONPATH holding this checkout and every installed package but the `llm` extra's libraries."""
    hidden = set(extra_libraries()["llm"])
    assert {"torch", "mlflow", "ray"} <= hidden
    view = tmp_path_factory.mktemp("light-site-packages")
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        top = entry.name.split("-")[0].split(".")[0].lower()  # torch, torch-2.13.0.dist-info
        if top not in hidden and entry.suffix != ".pth":
            (view / entry.name).symlink_to(entry)
    return os.pathsep.join([str(view), str(ROOT)])


def light(path: str, *argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": path}
    command = [sys.executable, "-S", *argv]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False)


def test_an_llm_step_without_its_libraries_says_so_in_one_line_and_is_not_retried(light_path, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.jsonl").write_text('{"prompt": "p", "completion": "c"}\n')
    argv = [f"--dataset-dir={data}", f"--report-dir={tmp_path / 'report'}", f"--outputs-dir={tmp_path / 'outputs'}"]
    done = light(light_path, "-m", "eksflow.llm.steps.validate_data", *argv, cwd=tmp_path)
    assert done.returncode == 2, done.stderr  # bad input: the workflow's retry skips it
    assert done.stderr.splitlines() == [
        "error: eksflow.llm.steps.validate_data needs the library 'great_expectations', which is not installed in this "
        'environment: pip install "eksflow[llm]"'
    ]


def test_run_refuses_an_llm_pipeline_without_its_libraries_before_the_first_task(light_path, tmp_path):
    (tmp_path / "champion_only.py").write_text(PIPELINE)
    done = light(light_path, "champion_only.py", "run", "--state-dir", str(tmp_path / "state"), cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith("error: the step champion needs the libraries of eksflow[llm], and torch, ray, mlflow, ")
    assert line.endswith(' are not installed in this environment: pip install "eksflow[llm]"')
    assert not (tmp_path / "state").exists()  # nothing started


def test_a_user_steps_missing_library_names_it_and_where_to_install_it():
    missing = ModuleNotFoundError("No module named 'sqlglot'", name="sqlglot")
    assert missing_library(missing, "steps.check_sql") == (
        "steps.check_sql needs the library 'sqlglot', which is not installed in this environment "
        "(No module named 'sqlglot'): install it where the step runs (its image)"
    )
