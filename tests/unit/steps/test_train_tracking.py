"""The train step and its MLflow: a server that cannot start the run fails the step before training, in one line.

It used to warn and train untracked (4 m 25 s on 2 cores), then evaluate failed against the same server and was
retried twice (issue 55). A TrackingError exits 1, so the workflow retries it, as the server may come up.
"""

import pytest

from eksflow.errors import EXIT_FAILED
from eksflow.llm.steps.common.tracking import TrackingError
from eksflow.llm.steps.train import Args
from eksflow.llm.steps.train.step import RUN_ID_FILE, _mlflow_run
from eksflow.runtime.ports import free_port


def test_an_unreachable_tracking_server_fails_the_step_before_training(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # the client's own retries: one try is enough here
    uri = f"http://127.0.0.1:{free_port()}"
    args = Args(dataset_dir=tmp_path, base_model="smollm2-135m-instruct", output_dir=tmp_path, tracking_uri=uri)
    with pytest.raises(TrackingError) as failed:
        _mlflow_run(args)
    assert failed.value.exit_code == EXIT_FAILED
    assert str(failed.value).startswith(f"MLflow at {uri} failed while starting the training run, before any")
    assert "\n" not in str(failed.value) and not (tmp_path / RUN_ID_FILE).exists()


def test_a_retry_keeps_the_run_an_earlier_attempt_started(tmp_path):
    (tmp_path / RUN_ID_FILE).write_text("abc123\n")
    args = Args(dataset_dir=tmp_path, base_model="smollm2-135m-instruct", output_dir=tmp_path, tracking_uri="x")
    assert _mlflow_run(args) == "abc123"
