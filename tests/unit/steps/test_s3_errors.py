"""S3 failures at the storage edge are one line naming what failed, the endpoint and what to check.

Against the real local S3 server (tests/conftest.py's moto_server) and an endpoint that is down; bad setup is
StepInputError (exit 2), an outage StepFailedError (exit 1, retried).
"""

import os
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import boto3
import pytest

from eksflow.llm.steps.common import checkpoints
from eksflow.llm.steps.common.base_model import resolve_model
from eksflow.llm.steps.common.s3errors import explain, s3_errors
from eksflow.llm.steps.common.storage import download_prefix
from eksflow.runtime.args import StepFailedError, StepInputError

REPO = Path(__file__).resolve().parents[3]


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def endpoint_down(s3_env, monkeypatch):
    """AWS_ENDPOINT_URL points at a port nothing listens on; one attempt, so the test does not wait on backoff."""
    url = f"http://127.0.0.1:{closed_port()}"
    monkeypatch.setenv("AWS_ENDPOINT_URL", url)
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    return url


def bucket_with(objects: dict[str, bytes]) -> str:
    s3 = boto3.client("s3")
    name = f"b-{closed_port()}"
    s3.create_bucket(Bucket=name)
    for key, body in objects.items():
        s3.put_object(Bucket=name, Key=key, Body=body)
    return name


def one_line(err: BaseException) -> str:
    text = str(err)
    assert "\n" not in text and "Traceback" not in text
    return text


def test_a_missing_bucket_is_bad_input_naming_the_endpoint(s3_env, tmp_path):
    with pytest.raises(StepInputError) as caught:
        download_prefix("s3://no-such-bucket/models/x", tmp_path / "x")
    text = one_line(caught.value)
    assert text.startswith("downloading s3://no-such-bucket/models/x failed: NoSuchBucket")
    assert f"at {s3_env}: the bucket does not exist; check the bucket name" in text


def test_an_endpoint_that_is_down_is_a_retryable_failure(endpoint_down, tmp_path):
    with pytest.raises(StepFailedError) as caught:
        download_prefix("s3://models/llama", tmp_path / "x")
    assert one_line(caught.value) == (
        f"downloading s3://models/llama failed: cannot connect to the S3 endpoint {endpoint_down}; check that it is "
        "up and that AWS_ENDPOINT_URL names it (a retry may succeed)"
    )


def test_no_credentials_is_bad_input(s3_env, monkeypatch, tmp_path):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # no instance metadata service to ask here
    with pytest.raises(StepInputError) as caught:
        download_prefix("s3://models/llama", tmp_path / "x")
    text = one_line(caught.value)
    assert "Unable to locate credentials" in text and "AWS_ACCESS_KEY_ID" in text and s3_env in text


def reset_auth(endpoint: str, free: str) -> None:
    """moto's switch: check signatures against its IAM once `free` more requests have passed ("inf": never)."""
    request = urllib.request.Request(
        f"{endpoint}/moto-api/reset-auth", data=free.encode(), method="POST", headers={"Content-Type": "text/plain"}
    )
    urllib.request.urlopen(request, timeout=30).close()


@pytest.fixture
def auth_enforced(s3_env):
    """Enforce authentication on the shared moto server within one test; off again afterwards."""
    yield lambda free: reset_auth(s3_env, str(free))
    reset_auth(s3_env, "inf")


def test_an_unknown_access_key_is_bad_input(s3_env, auth_enforced, tmp_path):
    bucket = bucket_with({"m/config.json": b"{}"})
    auth_enforced(0)
    with pytest.raises(StepInputError) as caught:
        download_prefix(f"s3://{bucket}/m", tmp_path / "x")
    text = one_line(caught.value)
    assert "InvalidAccessKeyId" in text and "the access key is not known to the endpoint" in text


def test_access_denied_is_bad_input(s3_env, auth_enforced, monkeypatch, tmp_path):
    bucket = bucket_with({"m/config.json": b"{}"})
    auth_enforced(2)  # the next two requests (create the user and its key) are not checked
    iam = boto3.client("iam", region_name="us-east-1")
    iam.create_user(UserName="no-policy")
    key = iam.create_access_key(UserName="no-policy")["AccessKey"]
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", key["AccessKeyId"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", key["SecretAccessKey"])
    with pytest.raises(StepInputError) as caught:
        download_prefix(f"s3://{bucket}/m", tmp_path / "x")
    text = one_line(caught.value)
    assert "AccessDenied" in text and "grant the role s3:ListBucket" in text


def test_base_model_from_a_missing_bucket(s3_env, tmp_path):
    with pytest.raises(StepInputError, match=r"^downloading s3://nope/llama failed: NoSuchBucket"):
        resolve_model("s3://nope/llama", tmp_path / "cache")


def test_restoring_checkpoints_with_the_endpoint_down(endpoint_down, tmp_path):
    with pytest.raises(StepFailedError, match=r"^listing durable checkpoints under s3://ckpt/run failed: cannot"):
        checkpoints.restore_latest("s3://ckpt/run", tmp_path)


def test_a_failed_durable_copy_is_one_warning_line(s3_env, tmp_path, capsys):
    step = tmp_path / "step-00000004"
    step.mkdir()
    (step / "model.safetensors").write_bytes(b"w")
    copy = checkpoints.DurableCopy("s3://no-such-bucket/run")
    copy.submit(checkpoints.Checkpoint(step, 4))
    (error,) = copy.close()
    assert error.startswith("durable copy of step-00000004 to s3://no-such-bucket/run/step-00000004 failed: ")
    assert "NoSuchBucket" in error and "\n" not in error
    assert capsys.readouterr().err.count("\n") == 1


@pytest.mark.parametrize(
    ("endpoint", "code", "expected"),
    [("down", 1, "cannot connect to the S3 endpoint"), ("up", 2, "bucket 'nope' of source")],
    ids=["endpoint-down", "missing-bucket"],
)
def test_the_stage_step_logs_one_line(s3_env, endpoint_down, tmp_path, endpoint, code, expected):
    env = {**os.environ, "AWS_ENDPOINT_URL": endpoint_down if endpoint == "down" else s3_env}
    argv = ["--source=s3://nope/data", f"--dest-dir={tmp_path / 'data'}", f"--outputs-dir={tmp_path / 'out'}"]
    result = subprocess.run(
        [sys.executable, "-m", "eksflow.llm.steps.stage_data", *argv],
        check=False,
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == code
    assert "Traceback" not in result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: ") and expected in line


def test_other_errors_keep_their_traceback():
    assert explain(ValueError("a bug"), "listing", "s3://b/p") is None
    with pytest.raises(KeyError), s3_errors("listing", "s3://b/p"):
        raise KeyError("a bug")


def test_step_errors_pass_through_unchanged():
    original = StepInputError("object key escapes the destination")
    with pytest.raises(StepInputError) as caught, s3_errors("downloading", "s3://b/p"):
        raise original
    assert caught.value is original


def test_a_5xx_is_retryable():
    from botocore.exceptions import ClientError

    err = ClientError({"Error": {"Code": "SlowDown", "Message": "Please reduce your request rate."}}, "GetObject")
    explained = explain(err, "reading", "s3://b/k")
    assert isinstance(explained, StepFailedError)
    assert "SlowDown (Please reduce your request rate.)" in str(explained)
