"""`run --resume` with new settings: those that say where a run reports (MLflow's URI, its UI link) are taken.

A run whose tracking server was wrong or went away failed after training; resuming it with the corrected URI was
refused (`started with other settings: mlflow.tracking_uri`), so the training was lost (issue 55). Settings mark
themselves (REPORTING, on the field), and any other change is still refused, naming only what would change the result.
"""

import io
from pathlib import Path

import pytest
from rich.console import Console

from eksflow.local import LocalExecutorError, load_run
from eksflow.local.rundir import RunFolder
from eksflow.run import execute, reporting_keys
from pipelines.champion_check import ChampionCheckConfig
from pipelines.llama_lora import LlamaLoraConfig
from pipelines.lora_sweep import LoraSweepConfig
from tests.unit.local.manifests import container, task, workflow

REPORTS_TO = "import sys; open(sys.argv[1], 'a').write(sys.argv[2] + '\\n'); sys.exit(int(sys.argv[3]))"


def manifest(log: Path, uri: str, code: int) -> dict:
    """One task that reports to `uri` (writes it down), then exits `code`: a template built from the config."""
    return workflow([task("evaluate", "evaluate")], [container("evaluate", REPORTS_TO, str(log), uri, str(code))])


def config(uri: str, steps: int = 12) -> dict:
    return {"mlflow": {"tracking_uri": uri, "ui_url": ""}, "train": {"max_steps": steps}}


def test_every_llm_pipeline_marks_the_mlflow_uri_and_ui_link_as_where_it_reports():
    for config_type in (LlamaLoraConfig, LoraSweepConfig, ChampionCheckConfig):
        assert reporting_keys(config_type) == {"mlflow.tracking_uri", "mlflow.ui_url"}


def test_a_resume_takes_a_new_tracking_uri_saying_so_and_refuses_a_setting_that_changes_the_result(tmp_path):
    state, log, out = tmp_path / "state", tmp_path / "reported", io.StringIO()
    console = Console(file=out, width=400)
    reporting = reporting_keys(LlamaLoraConfig)
    old, new = "http://127.0.0.1:9", "http://mlflow.example:5000"

    def run(uri: str, code: int, resume: str | None, settings: dict) -> int:
        return execute(
            manifest(log, uri, code), state, resume, console, root=tmp_path, config=settings, reporting=reporting
        )

    assert run(old, 1, None, config(old)) == 1  # the server was wrong: the task failed
    (name,) = [p.name for p in (state / "runs").iterdir()]
    with pytest.raises(LocalExecutorError, match=r"other settings: train\.max_steps \(12 -> 24\); resume without"):
        run(new, 0, name, config(new, steps=24))  # named alone: the URI would have been taken
    assert run(new, 0, name, config(new)) == 0
    assert log.read_text().splitlines() == [old, new]  # the failed task ran again, reporting to the new server
    assert f'resuming {name} with new mlflow.tracking_uri ("{old}" -> "{new}"): where it reports' in out.getvalue()
    assert RunFolder(state / "runs" / name).read_config() == config(new)  # the run's settings from now on
    assert load_run(state, name).phase == "Succeeded"
