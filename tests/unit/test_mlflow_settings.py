"""The `mlflow` section: a tracking URI MLflow can use from a step, and a server that answers before anything runs.

`run --set mlflow.tracking_uri=http://127.0.0.1:9` trained 4 m 25 s untracked before evaluate failed against the
same server (issue 55): a local run asks the server first, in one line. The URI took any text (`--flag=x`, `a b`),
and `base_model=s3://` was accepted where `data.source=s3://` was refused: one rule for both locations now.
"""

import http.server
import threading
from collections.abc import Iterator

import pytest

from eksflow.config import load_config
from eksflow.errors import ConfigError
from eksflow.llm.pipeline import MlflowSettings
from eksflow.run import local_problems
from eksflow.runtime.ports import free_port
from pipelines.llama_lora import LlamaLoraConfig
from pipelines.lora_sweep import LoraSweepConfig

REFUSED_URIS = {
    "an-option": "--flag=x",
    "a-space": "a b",
    "no-scheme": "mlruns",
    "s3": "s3://bucket/mlflow",
    "no-host": "http://",
    "bad-host": "http://--flag=x:5000",
    "bad-port": "http://mlflow:99999",
    "sqlite-in-memory": "sqlite://",
    "relative-file": "file:mlruns",
    "empty": "",
}
ACCEPTED_URIS = [
    "http://127.0.0.1:5000",
    "https://mlflow.example.com/tracking",
    "http://[::1]:5000",
    "sqlite:////fsx/mlflow/mlflow.db",
    "sqlite:///mlflow.db",
    "file:///fsx/mlruns",
    "postgresql+psycopg2://db.internal:5432/mlflow",
    "databricks",
]


@pytest.mark.parametrize("uri", REFUSED_URIS.values(), ids=REFUSED_URIS.keys())
def test_a_tracking_uri_mlflow_cannot_use_is_refused_in_one_line_naming_the_forms(uri):
    with pytest.raises(ConfigError) as refused:
        load_config(LlamaLoraConfig, None, [f"mlflow.tracking_uri={uri}"])
    (line,) = str(refused.value).splitlines()
    assert line.startswith("mlflow.tracking_uri: Value error, ") and "; give " in line, line


@pytest.mark.parametrize("uri", ACCEPTED_URIS)
def test_the_forms_mlflow_reads_are_accepted(uri):
    assert load_config(LlamaLoraConfig, None, [f"mlflow.tracking_uri={uri}"]).mlflow.tracking_uri == uri


@pytest.mark.parametrize("config_type", [LlamaLoraConfig, LoraSweepConfig])
@pytest.mark.parametrize("location", ["s3://", "s3://b", "s3:///models", "hf://org/model", "file://host/x"])
def test_base_model_and_data_source_follow_one_rule(config_type, location):
    problems = {}
    for key in ("base_model", "data.source"):
        with pytest.raises(ConfigError) as refused:
            load_config(config_type, None, [f"{key}={location}"])
        (line,) = str(refused.value).splitlines()
        assert line.startswith(f"{key}: "), line
        problems[key] = line.split(": Value error, ")[1].split(";")[0]  # the rule's words, before what each takes
    assert problems["base_model"] == problems["data.source"]


@pytest.mark.parametrize("config_type", [LlamaLoraConfig, LoraSweepConfig])
def test_a_base_model_bucket_or_folder_is_accepted(config_type):
    for reference in ("smollm2-135m-instruct", "s3://models-bucket/llama", "/fsx/models/llama", "file:///m"):
        assert load_config(config_type, None, [f"base_model={reference}"]).base_model == reference


def test_a_tracking_server_nobody_listens_on_is_refused_before_anything_runs():
    uri = f"http://127.0.0.1:{free_port()}"
    cfg = load_config(LlamaLoraConfig, None, [f"mlflow.tracking_uri={uri}"])
    assert local_problems(cfg) == [
        f"mlflow.tracking_uri: MLflow at {uri} cannot be reached (connection refused); start its server or fix the URI"
    ]


class NotMlflow(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_error(404)

    def log_message(self, *args: object) -> None:
        """Quiet."""


@pytest.fixture
def web_server() -> Iterator[str]:
    """A real HTTP server that is no MLflow (every path answers 404), as a mistyped port may reach."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotMlflow)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_server_that_is_no_mlflow_is_refused_naming_what_it_answered(web_server):
    (line,) = MlflowSettings(tracking_uri=web_server).local_problems()
    assert line == (
        f"tracking_uri: {web_server} answers HTTP 404 to GET /api/2.0/mlflow/experiments/search: give the address "
        "of an MLflow tracking server"
    )


def test_a_database_store_is_made_by_the_first_step_that_opens_it():
    assert MlflowSettings(tracking_uri="sqlite:////nonexistent/mlflow.db").local_problems() == []
