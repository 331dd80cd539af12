r"""Serve a registered model version, smoke-test it with a real chat completion, and promote it to `champion`.

    python -m steps.deploy --model-name=llama-lora --model-version=3 --tracking-uri=sqlite:////fsx/mlflow/mlflow.db \
        --serve-dir=/fsx/wf/serve

Downloads the version's "model" artifact, starts a real OpenAI-compatible server on it (`transformers serve`
here; vLLM in the cluster), waits for /health, sends the smoke prompt (temperature 0) and stops the server. Only
when the answer passes does alias `champion` move to this version (the former champion becomes `previous`); a
failed smoke test exits 1 and leaves `champion` where it was, so the serving version is unchanged.

Outputs (one file each under --outputs-dir):
    answer            the model's reply to the smoke prompt
    endpoint          the chat completions URL that was tested
    champion_version  the version now holding alias `champion`
"""

from __future__ import annotations

import sys
from pathlib import Path

from pydantic import BaseModel, Field

from eksflow.runtime.args import Location, Settings, StepArgs, StepInputError, run_step
from steps.common import serving, tracking

SMOKE_MAX_TOKENS = 32


class SmokeTestFailed(serving.ServingError):
    """The served model answered, but not what the smoke test expects."""


class DeploySettings(Settings):
    """How a new version is smoke-tested before it becomes the champion."""

    smoke_prompt: str = Field(
        "Rewrite this date in ISO 8601 format (YYYY-MM-DD). Answer with the date only.\nDate: July 4, 1976",
        min_length=1,
        description="user message sent to the served model (temperature 0, 32 tokens)",
    )
    smoke_expect: str = Field(
        "1976-07-04", description="text the answer must contain; empty accepts any non-empty answer"
    )
    startup_timeout_s: int = Field(300, ge=1, description="seconds to wait for the server's /health")
    port: int = Field(0, ge=0, le=65535, description="port of the local model server; 0 picks a free one")


class Args(DeploySettings, StepArgs):
    """Settings plus what the workflow wires in."""

    model_name: str = Field(pattern=tracking.MODEL_NAME_PATTERN, description="registered model name")
    model_version: str = Field(pattern=r"^[1-9][0-9]*$", description="version to deploy (register's model_version)")
    tracking_uri: Location = Field(description="MLflow tracking and registry URI")
    serve_dir: Path = Field(description="folder the registered model is downloaded into")


class Outputs(BaseModel):
    """Argo output parameters."""

    answer: str
    endpoint: str
    champion_version: str


def run(args: Args) -> Outputs:
    """Download, serve, smoke-test, stop; promote only if the answer passed."""
    with tracking.errors(args.tracking_uri, f"fetching {args.model_name} version {args.model_version}"):
        _check_version_exists(args)
        model_dir = serving.download_version(args.tracking_uri, args.model_name, args.model_version, args.serve_dir)
    port = args.port or serving.free_port()
    log_path = args.serve_dir / f"server-{args.model_name}-v{args.model_version}.log"
    with serving.model_server(
        model_dir, host="127.0.0.1", port=port, startup_timeout_s=args.startup_timeout_s, log_path=log_path
    ) as server:
        answer = serving.chat(server, args.smoke_prompt, max_tokens=SMOKE_MAX_TOKENS)
    print(f"smoke test answer from {server.chat_url}: {answer!r}", file=sys.stderr)
    if not smoke_passed(answer, args.smoke_expect):
        wanted = f"an answer containing {args.smoke_expect!r}" if args.smoke_expect else "a non-empty answer"
        raise SmokeTestFailed(
            f"smoke test failed for {args.model_name} version {args.model_version}: wanted {wanted}, got {answer!r}; "
            "alias champion not moved (check the model, or deploy.smoke_prompt / deploy.smoke_expect)"
        )
    with tracking.errors(args.tracking_uri, f"promoting {args.model_name} version {args.model_version}"):
        champion = tracking.promote(args.tracking_uri, args.model_name, args.model_version)
    print(f"{args.model_name} version {champion} is now champion", file=sys.stderr)
    return Outputs(answer=answer, endpoint=server.chat_url, champion_version=champion)


def smoke_passed(answer: str, expect: str) -> bool:
    """True if `answer` contains `expect`, or, with no expectation, is not blank."""
    return expect in answer if expect else bool(answer.strip())


def _check_version_exists(args: Args) -> None:
    from mlflow.exceptions import MlflowException

    try:
        tracking.client(args.tracking_uri).get_model_version(args.model_name, args.model_version)
    except MlflowException as err:
        if err.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise
        raise StepInputError(
            f"model {args.model_name!r} version {args.model_version} is not registered at {args.tracking_uri}; "
            "pass register's output (tasks.register.outputs.parameters.model_version)"
        ) from err


def main(argv: list[str] | None = None) -> int:
    """Entry point: `python -m steps.deploy --name=value ...`."""
    return run_step(Args, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
