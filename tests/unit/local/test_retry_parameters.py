"""`retry -p` and `resubmit -p` hold a value to the rules of the setting it stands for, before a new run starts.

`data_source` is declared from `data.source` and taken whole by stage_data's `--source`: a value the config refuses
(`--set data.source=...`) is refused with `-p` too, in one line and exit 2, and no run starts. A value the pipeline
itself declares or schedules is held to the same text rules.
"""

import io
from pathlib import Path

import pytest
from rich.console import Console

from eksflow import Pipeline, PipelineConfig, PipelineError
from eksflow.cli import main, parser
from eksflow.errors import ConfigError
from eksflow.llm.steps import (
    stage_data,  # the pipeline's step, imported as a pipeline imports it: its rules are the value's
)
from eksflow.verbs import run_verb
from tests.unit.local.manifests import run, task, workflow

HOSTILE = {
    "no-bucket": (
        "s3://",
        "-p data_source='s3://': eksflow.llm.steps.stage_data --source: Value error, names no valid bucket",
    ),
    "empty": ("", "-p data_source='': eksflow.llm.steps.stage_data --source: Value error, is empty"),
    "relative-file-uri": (
        "file://../../etc",
        "eksflow.llm.steps.stage_data --source: Value error, is not file:///absolute/path",
    ),
    "argo-expression": ("{{workflow.name}}", "-p data_source: holds '{{', which Argo would evaluate"),
    "too-long": ("a" * 70_000, "-p data_source: 70000 bytes of text; at most 65536"),
}


def staging(tmp_path: Path) -> dict:
    """A workflow whose parameter `data_source` feeds stage_data's --source whole, as the flagship's does."""
    template = {
        "name": "stage-data",
        "container": {
            "image": "python:3.11",
            "command": ["python", "-m", stage_data.__name__],
            "args": ["--source={{workflow.parameters.data_source}}", f"--dest-dir={tmp_path / 'staged'}"],
        },
    }
    parameters = [{"name": "data_source", "value": str(tmp_path / "no-such-dataset")}]
    return workflow([task("stage-data", "stage-data")], [template], arguments={"parameters": parameters})


def verb(tmp_path: Path, *argv: str) -> int:
    args = parser("demo.py", "").parse_args([*argv, "--state-dir", str(tmp_path / "state")])
    return run_verb(args, "demo", tmp_path, Console(file=io.StringIO()))


@pytest.mark.parametrize("command", ["retry", "resubmit"])
@pytest.mark.parametrize("hostile", HOSTILE, ids=HOSTILE)
def test_a_value_the_config_refuses_is_refused_by_retry_and_resubmit_before_a_run(tmp_path, command, hostile):
    failed = run(staging(tmp_path), tmp_path)  # the source is missing: stage-data fails, a run to retry
    assert failed.phase == "Failed", failed.message
    runs = sorted((tmp_path / "state" / "runs").iterdir())
    value, why = HOSTILE[hostile]
    with pytest.raises(ConfigError) as refused:
        verb(tmp_path, command, failed.name, "-p", f"data_source={value}")
    (line,) = str(refused.value).splitlines()
    assert line.startswith("-p data_source") and why in line, line
    assert len(line) < 400  # a long value is not echoed whole
    assert sorted((tmp_path / "state" / "runs").iterdir()) == runs  # no run started
    assert not (tmp_path / "staged").exists()


def test_a_value_within_the_rules_starts_the_run(tmp_path):
    failed = run(staging(tmp_path), tmp_path)
    dataset = tmp_path / "dataset"
    dataset.mkdir()
    (dataset / "data.jsonl").write_text('{"prompt": "1+1", "completion": "2"}\n')
    assert verb(tmp_path, "resubmit", failed.name, "-p", f"data_source={dataset}") == 0
    assert (tmp_path / "staged" / "manifest.json").is_file()


def test_the_pipeline_cli_refuses_it_in_one_line_with_exit_2(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("ARGO_SERVER", raising=False)
    from pipelines.llama_lora import build

    failed = run(staging(tmp_path), tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        main(build, ["retry", failed.name, "-p", "data_source=s3://", "--state-dir", str(tmp_path / "state")])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert err.startswith("config error: -p data_source='s3://': eksflow.llm.steps.stage_data --source:"), err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("parameters", "scheduled", "why"),
    [
        ({"who": "a" * 70_000}, {}, "workflow parameter who: 70000 bytes of text; at most 65536"),
        ({"who": "Ada"}, {"who": "{{workflow.name}}"}, "workflow parameter who: holds '{{', which Argo would evaluate"),
    ],
    ids=["declared-too-long", "scheduled-argo-expression"],
)
def test_a_value_the_pipeline_declares_or_schedules_is_held_to_the_same_rules(parameters, scheduled, why):
    with pytest.raises(PipelineError) as refused:
        Pipeline(PipelineConfig(name="t"), title="t", parameters=parameters, scheduled=scheduled)
    assert str(refused.value).startswith(why), refused.value
