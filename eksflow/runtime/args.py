"""One typed argument model per step, used on both sides of the Argo boundary.

The pipeline renders a step's arguments with `to_argv`; the step parses them back with `StepArgs.from_argv`.
Every value travels as one `--name=value` argv item (never through a shell), so quotes, `$(...)` or newlines
in a value reach the step byte-identical.
"""

from __future__ import annotations

import enum
import json
import sys
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError
from pydantic.fields import FieldInfo

from eksflow.errors import EXIT_BAD_INPUT, EXIT_FAILED, EksflowError
from eksflow.runtime.libraries import missing_library
from eksflow.runtime.outputs import write_outputs
from eksflow.runtime.shown import shown

K8S_NAME = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"  # a Kubernetes object name (DNS-1123 label): namespaces, claims, queues


class _LocationMarker:
    """Marks a text field whose value names a file: a path, or a URI holding one (sqlite:////fsx/mlflow.db)."""

    def __repr__(self) -> str:
        return "Location"


def _no_control_characters(value: str) -> str:
    # A newline in a path is never a real folder name, and every tool downstream (a vLLM `--model=`, a shell in a
    # user's script, a log line) would read it as a second item.
    if bad := sorted({repr(c) for c in value if ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0}):
        raise ValueError(f"a path or URI cannot hold control characters ({', '.join(bad)}); rename it")
    return value


# Mapped to a host folder by the local executor, like a Path.
Location = Annotated[str, _LocationMarker(), AfterValidator(_no_control_characters)]


class _ReportingMarker:
    """Marks a setting that changes where a run reports (a tracking server, a link), never what it computes."""

    def __repr__(self) -> str:
        return "Reporting"


# `ui_url: Annotated[str, REPORTING] = Field(...)`: `run --resume` takes a new value of it (eksflow.run).
REPORTING = _ReportingMarker()


def is_reporting(field: FieldInfo) -> bool:
    """True for a setting marked REPORTING: where a run reports, not what it computes."""
    return any(isinstance(meta, _ReportingMarker) for meta in field.metadata)


def is_location(field: FieldInfo) -> bool:
    """True for fields holding a path: Path (or Path | None) and `Location` text."""
    if any(isinstance(meta, _LocationMarker) for meta in field.metadata):
        return True
    annotation = field.annotation
    members = typing.get_args(annotation) if typing.get_origin(annotation) in (typing.Union, types.UnionType) else ()
    return annotation is Path or Path in members


class StepInputError(EksflowError):
    """Input the step cannot work with; the message says what was wrong and how to fix it. Exits 2."""

    label = "error"  # a step's lines read `error: <message>` (print_error), wherever they are printed
    exit_code = EXIT_BAD_INPUT


class StepFailedError(EksflowError):
    """An expected, explained failure (a dependency down, a check failed): one line on stderr, exit 1."""

    label = "error"
    exit_code = EXIT_FAILED


class Settings(BaseModel):
    """User-tunable values of a step: a section of the pipeline config. Unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class StepArgs(Settings):
    """Everything a step needs: its settings plus the values the workflow wires in."""

    outputs_dir: Path = Field(
        Path("/tmp/outputs"), description="folder for the output files, one per output parameter (Argo reads them)"
    )

    @classmethod
    def from_argv(cls, argv: Sequence[str]) -> typing.Self:
        """Parse `--name=value` items; raise StepInputError naming the flag on anything else."""
        values: dict[str, Any] = {}
        fields = cls.model_fields
        for item in argv:
            name, sep, raw = item.partition("=")
            key = name.removeprefix("--").replace("-", "_")
            if not name.startswith("--") or not sep:
                raise StepInputError(f"argument {item[:80]!r} is not of the form --name=value")
            if key not in fields:
                known = ", ".join(flag(f) for f in fields)
                raise StepInputError(f"unknown argument {name!r}; known: {known}")
            values[key] = raw if _is_text(fields[key].annotation) else _json_or_raw(raw)
        return cls.model_validate(values)


def flag(field: str) -> str:
    """The argv flag of a field: `adapter_dir` -> `--adapter-dir`."""
    return "--" + field.replace("_", "-")


def encode(value: object) -> str:
    """A field value as it travels in argv: text as is, scalars as JSON, models and containers as JSON."""
    if isinstance(value, str):
        return value
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, BaseModel):
        return value.model_dump_json()
    if isinstance(value, (list, tuple, dict)):
        return json.dumps(_jsonable(value), separators=(",", ":"))
    return json.dumps(value)


def to_argv(values: Mapping[str, object]) -> list[str]:
    """Render field values (or Argo expressions standing for them) as `--name=value` items."""
    return [f"{flag(name)}={encode(value)}" for name, value in values.items()]


def run_step(args_type: type[StepArgs], run: Callable[[Any], BaseModel], argv: Sequence[str] | None = None) -> int:
    """The thin `main()` of every step: parse, run the pure core, write its outputs. Bad input exits 2.

    A library the step imports that is not installed is bad input too (eksflow.runtime.libraries): one line naming
    it and the extra that brings it, never a traceback retried.
    """
    argv = sys.argv[1:] if argv is None else argv
    if any(item in ("-h", "--help") for item in argv):  # a value is always --name=value, never these
        print(describe(args_type))
        return 0
    try:
        args = args_type.from_argv(argv)
        outputs = run(args)
    except ValidationError as err:
        for line in error_lines(err):
            print_error(line)
        return EXIT_BAD_INPUT
    except (StepInputError, StepFailedError) as err:
        print_error(str(err))
        return err.exit_code
    except ModuleNotFoundError as err:  # a library not installed where the step runs: no retry installs it
        print_error(missing_library(err, args_type.__module__))
        return EXIT_BAD_INPUT
    try:
        write_outputs(args.outputs_dir, outputs)
    except OSError as err:  # a full or read-only folder: one line (no file is left half-written), and a retry may fit
        print_error(f"cannot write the outputs to {args.outputs_dir}: {err.strerror or err}")
        return EXIT_FAILED
    return 0


def describe(args_type: type[StepArgs]) -> str:
    """`--help` text: the module docstring, then each flag with its type, default and description."""
    module = sys.modules.get(args_type.__module__)
    lines = [
        (getattr(module, "__doc__", None) or args_type.__doc__ or "").strip(),
        "",
        "arguments (each as one --name=value item; lists, objects and numbers as JSON):",
    ]
    for name, field in args_type.model_fields.items():
        lines.append(f"  {flag(name)}={type_name(field.annotation)}  ({_default(field)})")
        if field.description:
            lines.append(f"      {field.description}")
    return "\n".join(lines)


def type_name(annotation: object) -> str:
    """A field's type as a user writes it: `int`, `path`, `one of ddp|fsdp`, `list of text`, `JSON object`."""
    origin = typing.get_origin(annotation)
    members = typing.get_args(annotation)
    if origin is typing.Annotated:
        return type_name(members[0])
    if origin is Literal:
        return "one of " + "|".join(str(m) for m in members)
    if origin in (typing.Union, types.UnionType):
        named = [type_name(m) for m in members if m is not type(None)]
        optional = " (or null)" if type(None) in members else ""
        return " or ".join(named) + optional
    if origin in (list, tuple, set, frozenset, Sequence):
        inner = [m for m in members if m is not Ellipsis]
        return f"list of {type_name(inner[0])}" if inner else "list"
    if origin in (dict, Mapping):
        return f"JSON object of {type_name(members[1])}" if len(members) == 2 else "JSON object"
    if isinstance(annotation, type):
        if issubclass(annotation, BaseModel):
            return f"JSON object ({annotation.__name__})"
        if issubclass(annotation, enum.Enum):
            return "one of " + "|".join(str(m.value) for m in annotation)
        names = {str: "text", Path: "path", bool: "true|false"}
        return names.get(annotation, annotation.__name__)
    return str(annotation).replace("typing.", "")


def _default(field: FieldInfo) -> str:
    """`required`, or the default as it would travel in argv (a default_factory is called, as validation would)."""
    if field.is_required():
        return "required"
    try:
        value = field.get_default(call_default_factory=True, validated_data={})
    except Exception:  # a factory that needs other fields or the environment: say so rather than fail --help
        return "default computed at run time"
    text = encode(value)
    return f"default {text!r}" if len(text) <= 200 else f"default {text[:197]!r}..."


def print_error(text: str) -> None:
    """`error: <text>` on stderr, each line through `shown` (a report's lines stay lines; nothing else acts)."""
    print("error: " + "\n".join(shown(line) for line in text.split("\n")), file=sys.stderr)


def error_lines(err: ValidationError) -> list[str]:
    """One line per problem, naming the flag: `--max-steps: Input should be greater than 0 (got -1)`."""
    lines = []
    for e in err.errors():
        where = flag(str(e["loc"][0])) + "".join(f"[{p}]" for p in e["loc"][1:]) if e["loc"] else "arguments"
        lines.append(f"{where}: {e['msg']} (got {e.get('input')!r})")
    return lines


def _is_text(annotation: object) -> bool:
    """True for fields whose argv value is the text itself (str, Path, str enums and literals)."""
    if annotation in (str, Path):
        return True
    origin = typing.get_origin(annotation)
    if origin is Literal:
        return all(isinstance(a, str) for a in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        members = [a for a in typing.get_args(annotation) if a is not type(None)]
        return len(members) == 1 and _is_text(members[0])
    if origin is typing.Annotated:
        return _is_text(typing.get_args(annotation)[0])
    return isinstance(annotation, type) and issubclass(annotation, str)


def _json_or_raw(raw: str) -> Any:
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw  # let the model report the type error against the value the user gave


def _jsonable(value: object) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    return value
