r"""Serve a registered model version in the foreground (OpenAI-compatible API) until Ctrl-C.

    python -m steps.serve --model-name=llama-lora --tracking-uri=sqlite:////path/to/mlflow.db [--alias=champion] \
        [--version=3] [--port=8000]

Not a pipeline step: the command a user runs after `run` to talk to the model the pipeline promoted. It uses the
same download and server code as steps.deploy, so what you try here is what the smoke test saw.

Outputs (one file each under --outputs-dir, when the server stops):
    endpoint        the chat completions URL that was served
    model_version   the version that was served
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

from pydantic import BaseModel, Field

from eksflow.runtime.args import Location, StepArgs, StepInputError, run_step
from steps.common import serving, tracking

EXIT_INTERRUPTED = 130  # the shell's code for SIGINT


class Args(StepArgs):
    """Which version to serve, and where."""

    model_name: str = Field(pattern=tracking.MODEL_NAME_PATTERN, description="registered model name")
    tracking_uri: Location = Field(
        "sqlite:////fsx/mlflow/mlflow.db", description="MLflow tracking and registry URI (the run's mlflow.db)"
    )
    alias: str = Field(tracking.CHAMPION, min_length=1, description="alias to serve when --version is not given")
    version: str = Field("", pattern=r"^([1-9][0-9]*)?$", description="version number; overrides --alias")
    host: str = Field("127.0.0.1", description="listen address; 0.0.0.0 exposes the server to the network")
    port: int = Field(8000, ge=0, le=65535, description="listen port; 0 picks a free one")
    serve_dir: Path = Field(
        Path.home() / ".cache" / "eksflow" / "serve", description="folder registered models are downloaded into"
    )
    startup_timeout_s: int = Field(300, ge=1, description="seconds to wait for the server's /health")


class Outputs(BaseModel):
    """What was served."""

    endpoint: str
    model_version: str


def run(args: Args) -> Outputs:
    """Serve until Ctrl-C or until the server exits by itself (then fail with its log)."""
    with tracking.errors(args.tracking_uri, f"looking up {args.model_name}"):
        version = args.version or resolve_alias(args.tracking_uri, args.model_name, args.alias)
        model_dir = serving.download_version(args.tracking_uri, args.model_name, version, args.serve_dir)
    port = args.port or serving.free_port(args.host)
    log_path = args.serve_dir / f"server-{args.model_name}-v{version}.log"
    print(f"starting {args.model_name} version {version} from {model_dir} (log: {log_path})", file=sys.stderr)
    with serving.model_server(
        model_dir, host=args.host, port=port, startup_timeout_s=args.startup_timeout_s, log_path=log_path
    ) as server:
        print(usage(server), flush=True)
        try:
            code = server.process.wait()
        except KeyboardInterrupt:
            print("\nstopping the server", file=sys.stderr)
            return Outputs(endpoint=server.chat_url, model_version=version)
    raise serving.ServingError(f"model server exited with code {code}; {serving.log_tail(log_path)}")


def resolve_alias(tracking_uri: str, model_name: str, alias: str) -> str:
    """The version number an alias points at; StepInputError if the alias is unset."""
    from mlflow.exceptions import MlflowException

    try:
        return str(tracking.client(tracking_uri).get_model_version_by_alias(model_name, alias).version)
    except MlflowException as err:
        if err.error_code not in tracking.NOT_FOUND_CODES:
            raise
        raise StepInputError(
            f"model {model_name!r} has no alias {alias!r} at {tracking_uri}; run the pipeline through deploy first, "
            "or pass --version=N"
        ) from err


def usage(server: serving.RunningServer) -> str:
    """The URL and a curl command that talks to it."""
    request = {"model": server.model, "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 64}
    curl = f"curl {server.chat_url} -H 'Content-Type: application/json' -d {shlex.quote(json.dumps(request))}"
    return f"serving {server.model} at {server.base_url} (OpenAI-compatible; Ctrl-C stops)\n\n  {curl}\n"


def main(argv: list[str] | None = None) -> int:
    """Entry point: `python -m steps.serve --name=value ...`."""
    try:
        return run_step(Args, run, argv)
    except KeyboardInterrupt:  # Ctrl-C while the model was still loading; the server is already stopped
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    raise SystemExit(main())
