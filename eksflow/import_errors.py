"""A pipeline file that fails while it is imported: one line per problem and exit 2, not a traceback.

A config class's own defaults are built when its module is imported, before `main()` (which prints every other
error) is even called:

    class MyConfig(ServingConfig):
        evaluate: EvaluateSettings = EvaluateSettings(thresholds=(Threshold(metric="same_rows", value=1.5),))

A default that breaks a rule raises pydantic's ValidationError there, and an uncaught exception is Python's to
print. `install()` (called when eksflow.config is imported, which every pipeline config's base class imports)
puts a hook in front of Python's: an uncaught EksflowError, or a ValidationError of an eksflow `Settings` model,
is printed as `config error: <file> line <n>: <Model>.<field>: <problem>` and exits with the error's code (2); any
other exception goes to the hook that was there before.
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType

from pydantic import BaseModel, ValidationError

from eksflow.errors import ConfigError, EksflowError
from eksflow.runtime.args import Settings
from eksflow.runtime.shown import redact, shown

EKSFLOW_DIR = Path(__file__).resolve().parent
MAX_SHOWN = 120  # characters of a refused value quoted in the line


def install() -> None:
    """Put the hook in front of the current one (once per process)."""
    if getattr(sys.excepthook, "_eksflow_hook", False):
        return
    previous = sys.excepthook

    def hook(kind: type[BaseException], error: BaseException, tb: TracebackType | None) -> None:
        if isinstance(error, EksflowError):
            lines, code, label = str(error).splitlines() or [type(error).__name__], error.exit_code, error.label
        elif isinstance(error, ValidationError) and _settings_model(error.title):
            lines, code, label = list(_problems(error, _where(tb))), ConfigError.exit_code, ConfigError.label
        else:
            previous(kind, error, tb)
            return
        for line in lines:
            print(f"{label}: {shown(line)}", file=sys.stderr)
        # Raised from the hook, SystemExit ends the interpreter with its code (as an uncaught one would), atexit run.
        raise SystemExit(code)

    hook._eksflow_hook = True  # type: ignore[attr-defined]
    sys.excepthook = hook


def _settings_model(title: str) -> bool:
    """Whether `title` (a ValidationError's) names a subclass of eksflow's Settings, a config section."""
    pending: list[type[BaseModel]] = [Settings]
    while pending:
        model = pending.pop()
        if model.__name__ == title:
            return True
        pending.extend(model.__subclasses__())
    return False


def _where(tb: TracebackType | None) -> str:
    """`<file> line <n>`: the innermost frame outside eksflow and pydantic, where the bad value was written."""
    frames = [frame for frame in traceback.extract_tb(tb) if not _library(Path(frame.filename))]
    if not frames:
        return ""
    path = Path(frames[-1].filename).resolve()
    shown_path = path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path
    return f"{shown_path} line {frames[-1].lineno}: "


def _library(path: Path) -> bool:
    return path.resolve().is_relative_to(EKSFLOW_DIR) or "pydantic" in path.parts


def _problems(error: ValidationError, where: str) -> Iterator[str]:
    for problem in error.errors():
        key = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in problem["loc"])
        message = problem["msg"].removeprefix("Value error, ")
        got = redact(repr(problem.get("input")))  # a refused URL may hold a password: never echo it
        got = got if len(got) <= MAX_SHOWN else f"{got[: MAX_SHOWN - 20]}... ({len(got)} characters)"
        yield f"{where}{error.title}{key}: {message} (got {got}); fix the value given there"
