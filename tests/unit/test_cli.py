"""The pipeline CLI as users meet it: every bad input is one line and exit 2, `config` round-trips, no tracebacks."""

import importlib
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from eksflow.cli import main
from eksflow.config import config_type
from eksflow.config_docs import rows
from pipelines.llama_lora import build as flagship_build

ROOT = Path(__file__).resolve().parents[2]
FLAGSHIP = ROOT / "pipelines" / "llama_lora.py"


def cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(FLAGSHIP), *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


@pytest.mark.parametrize(
    ("args", "first_line"),
    [
        (["render", "--set", "train.max_steps=[1"], "config error: --set train.max_steps:"),
        (["render", "--set", "train.lora=!!python/object:os.system x"], "config error: --set train.lora:"),
        (["render", "--set", 'mlflow.experiment=x {{=sprig.env("HOME")}}'], "config error: mlflow.experiment: holds"),
        (["render", "-o", "/nonexistent/d/x.yaml"], "config error: -o /nonexistent/d/x.yaml: cannot write it"),
        (["render", "--kind", "CronWorkflow", "--cron", "61 3 * * *"], "config error: --cron '61 3 * * *':"),
        (["schedule", "--cron", "60 3 * * 1"], "config error: --cron '60 3 * * 1': minute 60 is above 59"),
        (["run", "--set", "data.source=" + "a" * 300], f"config error: data.source: '{ROOT}/aaaaaaaa"),  # made absolute
        (["run", "--set", "data.source=/no/such/dataset"], "config error: data.source: '/no/such/dataset' does not"),
        (["run", "--config", "/no/such.yaml"], "config error: --config /no/such.yaml: file not found"),
        (
            ["render", "--set", 'evaluate.task_metrics=["exact_match","os:system"]'],
            "config error: evaluate.task_metrics:",
        ),
        (
            ["run", "--set", 'evaluate.task_metrics=["exact_match","shutil:copyfile"]'],
            "config error: evaluate.task_metrics:",
        ),
    ],
    ids=[
        "bad-yaml",
        "python-tag",
        "argo-expression",
        "output-folder",
        "cron",
        "schedule-cron",
        "long-source",
        "no-source",
        "no-config",
        "metric-os-system",
        "metric-copyfile",
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, first_line, tmp_path):
    done = cli(*args, "--state-dir", str(tmp_path)) if args[0] == "run" else cli(*args)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.startswith(first_line), done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "runs").exists()


def test_config_prints_the_effective_config_which_reads_back_the_same(tmp_path):
    done = cli("config", "--set", "train.max_steps=7", "--set", "mlflow.experiment=a\nb")
    assert done.returncode == 0, done.stderr
    (tmp_path / "effective.yaml").write_text(done.stdout)
    again = cli("config", "--config", str(tmp_path / "effective.yaml"))
    assert again.returncode == 0, again.stderr
    assert yaml.safe_load(again.stdout) == yaml.safe_load(done.stdout)
    assert yaml.safe_load(done.stdout)["train"]["max_steps"] == 7
    assert yaml.safe_load(done.stdout)["mlflow"]["experiment"] == "a\nb"


def test_config_lists_keys_and_gives_a_json_schema():
    keys = cli("config", "--keys")
    assert keys.returncode == 0
    assert "| train.learning_rate | float | 0.001 | peak learning rate |" in keys.stdout.splitlines()
    schema = json.loads(cli("config", "--schema").stdout)
    assert "train" in schema["properties"] and schema["additionalProperties"] is False


def in_process(build, capsys, *argv: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_info:
        main(build, list(argv))
    out, err = capsys.readouterr()
    return int(exit_info.value.code or 0), out, err


def test_a_password_in_the_tracking_uri_is_refused_naming_the_supported_way(capsys):
    code, out, err = in_process(
        flagship_build, capsys, "render", "--set", "mlflow.tracking_uri=https://user:hunter22@host"
    )
    assert code == 2
    assert len(err.splitlines()) == 1 and err.startswith("config error: mlflow.tracking_uri: holds a credential")
    assert "MLFLOW_TRACKING_TOKEN" in err and "hunter22" not in out + err


CREDENTIAL_URLS = {
    "userinfo": "https://admin:hunter22@host.example.com/x",
    "token-query": "https://host.example.com/x?access_token=hunter22",
    "presigned": "s3://bucket/data.jsonl?X-Amz-Signature=hunter22&X-Amz-Credential=AKIA",
}


@pytest.mark.parametrize("url", CREDENTIAL_URLS.values(), ids=CREDENTIAL_URLS.keys())
@pytest.mark.parametrize("pipeline", ["llama_lora", "lora_sweep", "champion_check"])
def test_no_text_setting_of_any_pipeline_takes_a_credential_in_a_url(capsys, pipeline, url):
    build = importlib.import_module(f"pipelines.{pipeline}").build
    for key, kind, _, _ in rows(config_type(build)):
        if kind not in ("str", "location"):
            continue
        code, out, err = in_process(build, capsys, "render", "--set", f"{key}={url}")
        assert code == 2, f"{pipeline} {key} accepted {url}"
        section, _, field = key.rpartition(".")
        named = err.startswith(f"config error: {key}") or (err.startswith(f"config error: {section}:") and field in err)
        assert len(err.splitlines()) == 1 and named, err
        assert "hunter22" not in out + err


def test_a_pipeline_built_without_a_title_is_one_line_naming_title_and_exit_2(capsys):
    from eksflow import Pipeline, PipelineConfig

    def build(cfg: PipelineConfig) -> Pipeline:
        with Pipeline(cfg) as p:
            return p

    code, out, err = in_process(build, capsys, "render")
    assert code == 2 and not out
    assert len(err.splitlines()) == 1 and err.startswith("pipeline error: Pipeline(...) needs title="), err


SHADOWED_PIPELINE = """
from eksflow import Pipeline, PipelineConfig, task
from tests.unit.test_pipeline import make


def build(cfg: PipelineConfig) -> Pipeline:
    with Pipeline(cfg, title="a project with its own eksflow") as p:
        task(make, out_dir="/x")
    return p
"""


def test_a_project_whose_own_package_is_named_eksflow_is_refused_in_one_line(tmp_path, capsys):
    """Its tasks run with the project first on PYTHONPATH: each would import the project's `eksflow` and fail."""
    (tmp_path / "eksflow").mkdir()
    (tmp_path / "eksflow" / "__init__.py").write_text('"""The project\'s own helpers."""\n')
    (tmp_path / "flows").mkdir()
    (tmp_path / "flows" / "__init__.py").write_text("")
    (tmp_path / "flows" / "hello.py").write_text(SHADOWED_PIPELINE)
    spec = importlib.util.spec_from_file_location("flows_hello", tmp_path / "flows" / "hello.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    state = tmp_path / "state"
    for command in (["render"], ["run", "--state-dir", str(state)]):
        code, out, err = in_process(module.build, capsys, *command)
        assert (code, out) == (2, "")
        assert err.splitlines() == [
            f"pipeline error: {tmp_path}/eksflow/__init__.py: the project's own `eksflow` shadows the eksflow "
            f"library in its tasks, which run in {tmp_path} with it first on PYTHONPATH; fix: give the project's "
            "own another name"
        ]
    assert not state.exists()  # refused before anything ran
    (tmp_path / "eksflow" / "__init__.py").unlink()  # a folder without __init__.py: the library is still found first
    assert in_process(module.build, capsys, "render")[0] == 0
