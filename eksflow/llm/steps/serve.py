r"""Serve the champion with vLLM in the foreground (OpenAI-compatible API) until Ctrl-C.

    python -m eksflow.llm.steps.serve --model-name=llama-lora --tracking-uri=sqlite:////path/to/mlflow.db \
        [--alias=champion] [--version=3] [--port=8000]
    make serve                        # the champion of the last `make run`, on 127.0.0.1:8000

Not a pipeline step: the command a user runs to talk to the model a rollout promoted. The engine is the one the
fleet runs (eksflow/llm/steps/common/vllm.py): the version's base model (its `base_model` tag) plus its LoRA adapter,
served under the registered model's name, so a request for model "llama-lora" answers with the adapter; the plain base
model answers as "<name>-base". The adapter is checked (rank, base model) before the engine starts: bad input
exits 2 without starting anything. A whole-model version (kind `model`: a full fine-tune, or an adapter merged into
its base) is served as it is, its registered folder under the registered model's name, without LoRA.

Every route asks for the API key (eksflow/llm/steps/common/vllm_auth.py), runtime LoRA loading included: the key is made
once (`secrets.token_urlsafe`), kept in <serve dir>/api-key (a file of the user's, never a link, mode 0600, one line;
reused at every start), given to the engine in its environment (never argv) and shown in the curl line. `--host` is
an IP address or an RFC 1123 host name.

Outputs (one file each under --outputs-dir, when the server stops):
    endpoint        the chat completions URL that was served
    model_version   the version that was served
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import secrets
import shlex
import stat
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, Field, field_validator

from eksflow.llm.steps.common import (
    adapters,
    chat_template,
    served_models,
    tracking,
    vllm,
    vllm_auth,
    vllm_client,
    vllm_lora,
    vllm_process,
)
from eksflow.llm.steps.common.base_model import default_cache_dir, resolve_model
from eksflow.runtime.args import Location, StepArgs, StepInputError, run_step

if TYPE_CHECKING:
    from mlflow.entities.model_registry import ModelVersion

EXIT_INTERRUPTED = 130  # the shell's code for SIGINT
KEY_FILE = "api-key"  # in --serve-dir: the engine's key, reused across restarts
_HOST_LABEL = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?")  # RFC 1123: digits may lead
_KEY = re.compile(r"[A-Za-z0-9._~+/-]+=*")  # RFC 6750's b64token: what `Authorization: Bearer` carries, one line
_KEY_FILE_BYTES = 4096  # far more than any key; a bigger file is not one


class Args(vllm.EngineSettings, StepArgs):
    """Which version to serve, where, and the engine's settings."""

    model_name: str = Field(pattern=tracking.MODEL_NAME_PATTERN, description="registered model name, served as is")
    tracking_uri: Location = Field(
        "sqlite:////fsx/mlflow/mlflow.db", description="MLflow tracking and registry URI (the run's mlflow.db)"
    )
    alias: str = Field(tracking.CHAMPION, min_length=1, description="alias to serve when --version is not given")
    version: str = Field("", pattern=r"^([1-9][0-9]*)?$", description="version number; overrides --alias")
    host: str = Field(
        "127.0.0.1", description="listen address, an IP or a host name; 0.0.0.0 exposes the server to the network"
    )
    port: int = Field(8000, ge=1, le=65535, description="listen port")
    serve_dir: Path = Field(
        Path.home() / ".cache" / "eksflow" / "serve", description="folder registered adapters are downloaded into"
    )
    model_cache_dir: Path = Field(default_factory=default_cache_dir, description="where base models are converted")

    @field_validator("host")
    @classmethod
    def _address(cls, host: str) -> str:
        try:
            ipaddress.ip_address(host)
        except ValueError:
            labels = host.split(".")
            if len(host) > 253 or not all(_HOST_LABEL.fullmatch(label) for label in labels):
                raise ValueError(
                    "neither an IP address nor a host name (RFC 1123: dot-separated labels of letters, digits and "
                    "inner hyphens, 63 characters each); e.g. --host=127.0.0.1"
                ) from None
        return host


class Outputs(BaseModel):
    """What was served."""

    endpoint: str
    model_version: str


def run(args: Args) -> Outputs:
    """Check the adapter, start the engine, answer until Ctrl-C (or fail with the engine's log if it dies)."""
    kept = kept_key(args.serve_dir)  # a key file that holds no key, or cannot be kept, fails before anything is read
    tracking.require_registry(args.tracking_uri)  # before a key file is made: a mistyped registry leaves nothing
    key = kept or api_key(args.serve_dir)
    version = args.version or resolve_alias(args.tracking_uri, args.model_name, args.alias)
    registered = adapters.registered_version(args.tracking_uri, args.model_name, version)  # read once: tags, run
    if tracking.is_model(registered):  # a whole model (a full fine-tune, a merged adapter): served as it is
        with tracking.errors(args.tracking_uri, f"downloading {args.model_name} version {version}"):
            _, folder = served_models.publish(registered, args.serve_dir / args.model_name / "models")
        engine_args = [
            *vllm.engine_args(str(folder), args.model_name, args.port, args, lora=False),
            f"--host={args.host}",
        ]
        served = f"{args.model_name} v{version}, a whole model"
    else:
        engine_args, served = _adapter_on_its_base(args, registered, version)
    log_path = args.serve_dir / f"vllm-{args.model_name}-v{version}.log"
    host = f"[{args.host}]" if ":" in args.host else args.host  # an IPv6 address in a URL
    base_url = f"http://{host}:{args.port}"
    env = {**vllm.engine_env(args, cpu=True), vllm_auth.KEY_ENV: key}
    print(f"starting vLLM: {served} (log: {log_path})", file=sys.stderr)
    with vllm_process.engine(engine_args, env, log_path=log_path) as process:
        vllm_client.wait_ready(
            base_url, args.model_name, api_key=key, timeout_s=args.startup_timeout_s, process=process,
            log_path=log_path,
        )  # fmt: skip
        print(usage(base_url, args.model_name, key), flush=True)
        print(f"the API key is in {args.serve_dir / KEY_FILE}", file=sys.stderr)
        try:
            code = process.wait()
        except KeyboardInterrupt:
            print("\nstopping vLLM", file=sys.stderr)
            return Outputs(endpoint=f"{base_url}/v1/chat/completions", model_version=version)
    raise vllm.ServingError(f"vLLM exited with code {code}; {vllm_process.log_excerpt(log_path)}")


def _adapter_on_its_base(args: Args, registered: ModelVersion, version: str) -> tuple[list[str], str]:
    """The engine's flags for a LoRA version, and what is served (for the log line).

    Its base model (with the template it trained through) and the adapter, checked before anything starts.
    """
    base_model = (registered.tags or {}).get("base_model", "")
    if not base_model:
        raise StepInputError(
            f"--version={version}: the version has no base_model tag; register it with eksflow.llm.steps.register"
        )
    adapter = adapters.download(registered, args.serve_dir / args.model_name)
    template = chat_template.recorded(
        args.tracking_uri, str(registered.run_id or ""), args.serve_dir / args.model_name / f"v{version}-template"
    )
    # the model folder training and evaluate loaded: its chat template is the one the engine applies
    base_dir = template.templated(resolve_model(base_model, args.model_cache_dir), args.model_cache_dir)
    vllm_lora.check_adapter(
        vllm_lora.read_adapter(adapter, "--version"), args.max_lora_rank, base_dir, f"--version={version}"
    )
    engine_args = [
        *vllm.engine_args(str(base_dir), f"{args.model_name}-base", args.port, args),
        f"--host={args.host}",
        f"--lora-modules={args.model_name}={adapter}",
    ]
    return engine_args, f"{args.model_name} v{version} on {base_model}"


def resolve_alias(tracking_uri: str, model_name: str, alias: str) -> str:
    """The version number an alias points at; StepInputError if the alias is unset."""
    found = tracking.alias_version(tracking_uri, model_name, alias)
    if found is None:
        raise StepInputError(
            f"model {model_name!r} has no alias {alias!r} at {tracking_uri}; run the pipeline through promote first, "
            "or pass --version=N"
        )
    return str(found.version)


def key_path(serve_dir: Path) -> Path:
    """serve_dir/api-key; StepInputError (exit 2) when a link or anything but a file is in its place."""
    path = serve_dir / KEY_FILE
    if path.is_symlink():  # its target's content would become the key, and be printed in the curl line
        raise StepInputError(
            f"--serve-dir: {path} is a symbolic link; the key is kept in a file of its own: remove the link, and the "
            "next start makes a new key there"
        )
    if path.exists() and not path.is_file():
        raise StepInputError(
            f"--serve-dir: {path} is not a file (a folder?); remove it, and the next start makes a new key there"
        )
    return path


def api_key(serve_dir: Path) -> str:
    """The engine's key from serve_dir/api-key (mode 0600, ours), made once with `secrets.token_urlsafe`.

    A key file that others could read (group or other permission bits) is replaced: that key may have leaked. A link
    or anything but a file in its place (`key_path`), a file of another user's, one that is not a single key (one line
    of what a Bearer header carries), or a file that cannot be read or written, is bad input (exit 2).
    """
    key = kept_key(serve_dir)
    if key:
        return key
    path = key_path(serve_dir)
    try:
        path.unlink(missing_ok=True)
        serve_dir.mkdir(parents=True, exist_ok=True)
        key = secrets.token_urlsafe(32)
        # Never readable by others, not even briefly; O_EXCL: a link or file made meanwhile is not written through.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(key + "\n")
    except OSError as err:
        raise _unkeepable(path, err) from None
    return key


def kept_key(serve_dir: Path) -> str:
    """The key serve_dir/api-key keeps, "" when there is none to keep; what `api_key` refuses, refused (exit 2)."""
    path = key_path(serve_dir)
    try:
        return _kept_key(path)
    except (OSError, UnicodeDecodeError) as err:
        raise _unkeepable(path, err) from None


def _unkeepable(path: Path, err: OSError | UnicodeDecodeError) -> StepInputError:
    why = err.strerror if isinstance(err, OSError) and err.strerror else type(err).__name__
    return StepInputError(f"--serve-dir: cannot keep the API key in {path} ({why}); give a folder you own")


def _kept_key(path: Path) -> str:
    """The key in `path`; "" when there is none to keep (no file, an empty one, or one others could read)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)  # a link put there since key_path looked is refused too
    except FileNotFoundError:
        return ""
    with os.fdopen(fd, "rb") as f:
        facts = os.fstat(f.fileno())
        text = f.read(_KEY_FILE_BYTES + 1).decode("utf-8")
    if not stat.S_ISREG(facts.st_mode) or facts.st_uid != os.geteuid():
        raise StepInputError(
            f"--serve-dir: {path} is not a file of yours (owner uid {facts.st_uid}); whoever made it may know the key: "
            "remove it, and the next start makes a new key there"
        )
    key = text.removesuffix("\n")
    if not key:
        return ""
    if len(text) > _KEY_FILE_BYTES or not _KEY.fullmatch(key):
        raise StepInputError(
            f"--serve-dir: {path} does not hold one key (a single line of letters, digits and -._~+/=, as "
            "`secrets.token_urlsafe` makes); remove it, and the next start makes a new key there"
        )
    if stat.S_IMODE(facts.st_mode) & 0o077:
        print(f"{path} was readable by others: a new key replaces it", file=sys.stderr)
        return ""
    return key


def usage(base_url: str, model: str, key: str) -> str:
    """The URL and a curl command, with the key, that talks to the served adapter."""
    request = {
        "model": model,
        "messages": [
            {
                "role": "user",
                "content": "Rewrite this date in ISO 8601 format (YYYY-MM-DD). Answer with the "
                "date only.\nDate: July 4, 1976",
            }
        ],
        "max_tokens": 16,
        "temperature": 0,
    }
    url = f"{base_url}/v1/chat/completions"
    auth = shlex.quote(f"Authorization: Bearer {key}")
    curl = f"curl -s {url} -H {auth} -H 'Content-Type: application/json' -d {shlex.quote(json.dumps(request))}"
    return f"serving {model} at {base_url} with vLLM (OpenAI-compatible; Ctrl-C stops)\n\n  {curl}\n"


def main(argv: list[str] | None = None) -> int:
    """Entry point: `python -m eksflow.llm.steps.serve --name=value ...`."""
    try:
        return run_step(Args, run, argv)
    except KeyboardInterrupt:  # Ctrl-C while the engine was still loading; it is already stopped
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    raise SystemExit(main())
