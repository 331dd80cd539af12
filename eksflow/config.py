"""Configuration per pipeline: a base every pipeline shares, extended with the pipeline's own sections.

    class HelloConfig(PipelineConfig):
        name: str = name_field("hello")
        image: str = image_field("ghcr.io/example/greeter:0.1.0")  # the project's own step image
        greeting: GreetSettings = GreetSettings()                  # a step's own Settings model is the section

Defaults live in the models; a YAML file (`--config`) and `--set dotted.key=value` only override, each onto the
pipeline's declared default at any depth (`train: TrainSettings = TrainSettings(max_steps=30)` keeps max_steps=30
under `--set train.learning_rate=...`; a list is replaced whole, a map merged key by key). A `--set` value
is read as the target field's type: a text field takes the text as given (quotes, newlines and all), any other
field parses it as YAML. Unknown keys are errors, every error is reported at once, one line each, naming the key
and the fix. Text that Argo would evaluate (`{{`) and text longer than MAX_TEXT_BYTES are refused here, before
anything is rendered: a value reaches its step byte-identical or not at all.
"""

from __future__ import annotations

import hashlib
import inspect
import itertools
import re
import typing
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar, get_args, get_origin

import yaml
from pydantic import AfterValidator, BaseModel, Field, ValidationError, field_validator
from pydantic_core import to_jsonable_python

from eksflow import import_errors
from eksflow.config_file import read_yaml
from eksflow.errors import ConfigError, PipelineError
from eksflow.kinds import kind_of
from eksflow.runtime.args import K8S_NAME, Settings
from eksflow.runtime.shown import redact, url_setting_problem

# One argv item must stay well under Linux's 128 KiB per-argument limit, and a manifest under the API server's
# ~1.5 MiB object limit: 64 KiB of text per setting is more than any prompt or path needs.
MAX_TEXT_BYTES = 64 * 1024
IMAGE_REFERENCE = re.compile(r"[a-z0-9][\w.\-/:]*(@sha256:[0-9a-f]{64})?")  # an image name: no space, quote, newline
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
RESERVED_ENV_PREFIXES = ("EKSFLOW_", "ARGO_")

C = TypeVar("C", bound="PipelineConfig")

import_errors.install()  # a config class's own bad default is refused while its module imports: one line, exit 2


def name_field(default: str) -> Any:
    """A pipeline config's `name` field with that pipeline's default name (a Kubernetes name prefix)."""
    return Field(default, pattern=K8S_NAME, max_length=50, description="workflow name prefix")


def image_field(default: str, description: str = "image of the pipeline's steps (your project's own)") -> Any:
    """An image field: a pinned reference (repo:tag, not latest, or repo@sha256:<digest>), checked when loaded.

    A project sets the default image of its steps in code, `image: str = image_field("registry/project:1.0")`, and
    a deployment overrides it in config (`image: ...` or `--set image=...`).
    """
    return Field(default, description=description, validate_default=True)


def pinned_image(image: str) -> str:
    """`image` if it is a pinned image reference; ValueError naming the fix otherwise."""
    if not IMAGE_REFERENCE.fullmatch(image):
        raise ValueError(f"{image!r} is not an image reference (registry/repository:tag or @sha256:<digest>)")
    name = image.rsplit("/", 1)[-1]
    if "@sha256:" not in image and (":" not in name or name.endswith(":latest")):
        raise ValueError(f"image {image!r} is not pinned; use repo:tag (not latest) or repo@sha256:<digest>")
    return image


Image = Annotated[str, AfterValidator(pinned_image)]  # a pinned image reference


class StorageSettings(Settings):
    """Shared storage: the FSx for Lustre claim every step mounts."""

    fsx_claim: str = Field(
        "fsx-claim", pattern=K8S_NAME, max_length=253, description="PersistentVolumeClaim of the FSx volume"
    )
    fsx_mount: str = Field("/fsx", pattern=r"^/[\w\-/]*$", description="where every pod mounts it")


class RetrySettings(Settings):
    """How a failed step is retried: everything but bad input (exit 2), with exponential backoff."""

    limit: int = Field(2, ge=0, le=20, description="retries of a failed step (a task can set its own)")
    first_delay: str = Field("10s", pattern=r"^\d+(s|m|h)$", description="wait before the first retry")
    max_delay: str = Field("5m", pattern=r"^\d+(s|m|h)$", description="longest wait between retries")


class CleanupSettings(Settings):
    """What Argo deletes after a run: its pods, then the Workflow object (the FSx run folder stays)."""

    pod_gc: Literal["OnPodSuccess", "OnPodCompletion", "OnWorkflowSuccess", "OnWorkflowCompletion"] = Field(
        "OnPodSuccess", description="when pods are deleted (a failed pod is kept for its logs by default)"
    )
    keep_succeeded_s: int = Field(7 * 24 * 3600, ge=0, description="seconds a succeeded Workflow is kept")
    keep_failed_s: int = Field(14 * 24 * 3600, ge=0, description="seconds a failed Workflow is kept")


class PipelineConfig(Settings):
    """The base of every pipeline's config: where it runs, its image, storage, retries and cleanup.

    Pipelines add their own sections: a step's Settings model is a section, `cluster: ClusterSettings` the place
    of distributed steps.
    """

    name: str = name_field("eksflow")
    namespace: str = Field("argo", pattern=K8S_NAME, max_length=63, description="Kubernetes namespace of the workflow")
    service_account: str = Field(
        "eksflow-pipeline", pattern=K8S_NAME, max_length=253, description="pods' service account (IRSA)"
    )
    image: str = image_field("ghcr.io/eksflow/steps:0.1.0")
    active_deadline_seconds: int = Field(24 * 3600, ge=60, description="the whole workflow's time limit")
    memoize: bool = Field(
        True, description="reuse a task's outputs when its step, settings and input data equal an earlier success"
    )
    memoize_max_age: str = Field(
        "720h", pattern=r"^\d+(s|m|h)$", description="how long a memoized result may be reused (Go duration)"
    )
    env: dict[str, str] = Field(
        {}, description="environment of every step container, e.g. {HF_HUB_OFFLINE: '1'} (no secrets: use Secrets)"
    )
    storage: StorageSettings = StorageSettings()
    retry: RetrySettings = RetrySettings()
    cleanup: CleanupSettings = CleanupSettings()

    # A validator, not the Image type: a pipeline that redeclares `image: str = image_field(...)` keeps the check.
    @field_validator("image")
    @classmethod
    def _pinned(cls, image: str) -> str:
        return pinned_image(image)

    @field_validator("env")
    @classmethod
    def _env_names(cls, env: dict[str, str]) -> dict[str, str]:
        for name in env:
            if not ENV_NAME.fullmatch(name):
                raise ValueError(f"{name[:60]!r} is not an environment variable name (letters, digits, _)")
            if name.startswith(RESERVED_ENV_PREFIXES):
                raise ValueError(f"{name}: names starting {' or '.join(RESERVED_ENV_PREFIXES)} are reserved; rename it")
        return env


def config_type(build: Callable[..., Any]) -> type[PipelineConfig]:
    """The config model a pipeline's build function takes: the annotation of its first parameter; else PipelineError."""
    parameters = list(inspect.signature(build).parameters)
    hints = typing.get_type_hints(build)
    found = hints.get(parameters[0]) if parameters else None
    if not (isinstance(found, type) and issubclass(found, PipelineConfig)):
        raise PipelineError(f"{build.__qualname__} must take one argument annotated with a PipelineConfig subclass")
    return found


def load_config(config_type: type[C], path: Path | None = None, overrides: Iterable[str] = ()) -> C:
    """The declared defaults, the YAML file, then each `dotted.key=value` merged over them; ConfigError if bad."""
    raw: dict[str, Any] = read_yaml(path) if path is not None else {}
    problems = []
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key or any(not part for part in key.split(".")):
            problems.append(f"--set {item[:80]!r}: expected dotted.key=value, e.g. --set train.max_steps=20")
            continue
        try:
            _assign(raw, key.split("."), _typed(config_type, key, value))
        except ConfigError as err:
            problems.append(str(err))
    if problems:
        raise ConfigError("\n".join(problems))
    fields = config_type.model_fields
    declared = {  # the defaults of the fields given: each override goes onto its own (`_onto`)
        key: fields[key].get_default(call_default_factory=True, validated_data={})
        for key in raw
        if key in fields and not fields[key].is_required()
    }
    try:
        cfg = config_type.model_validate(_onto(declared, {}, raw))
    except ValidationError as err:
        raise ConfigError("\n".join(explain(err, config_type))) from err
    text_problems = [f"{key}: {why}" for key, why in _text_problems(cfg)]
    if text_problems:
        raise ConfigError("\n".join(text_problems))
    return cfg


def _merged(default: object, given: object) -> object:
    """`given` over `default`, key by key at any depth where both are sections (or maps); anything else replaces it."""
    if not isinstance(given, dict):
        return given  # a value, a list (replaced whole) or null (an optional section left out)
    if isinstance(default, BaseModel):
        current = {name: getattr(default, name) for name in type(default).model_fields}
        return _onto(current, {name: current[name] for name in default.model_fields_set}, given)
    if isinstance(default, dict):
        return {**default, **{key: _merged(default.get(key), value) for key, value in given.items()}}
    return given


def _onto(current: dict[str, Any], kept: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    """A model's fields to validate: `kept` (those its default was given), then each key `given` changes, merged.

    Validated alone, `{"train": {...}}` would rebuild `train` from its class's defaults and drop the pipeline's own
    `TrainSettings(max_steps=30)`; merged, an override reads as if added to that constructor call. A key given the
    value it has (as is, or as `config` prints it) is left out: `model_fields_set` stays what the pipeline set plus
    what an override changed (plan checks a layout the user set). Kept values are validated again, so a validator
    must accept its own output (tests/unit/test_config_defaults.py checks ours).
    """
    changed = {
        key: value
        for key, value in given.items()
        if key in kept or key not in current or value not in (current[key], to_jsonable_python(current[key]))
    }
    return {**kept, **{key: _merged(current.get(key), value) for key, value in changed.items()}}


def explain(err: ValidationError, config_type: type[BaseModel]) -> list[str]:
    """One line per problem: `train.learning_rate: Input should be greater than 0 (got -1); fix: ...`."""
    lines = []
    for e in err.errors():
        # `evaluate.thresholds[0].value`: the item is named, and the fix sets the list that holds it, whole
        # (`--set evaluate.thresholds=[...]`: --set takes no index, and nothing below one)
        field_key = ".".join(str(p) for p in itertools.takewhile(lambda part: isinstance(part, str), e["loc"]))
        key = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in e["loc"]).lstrip(".")
        if e["type"] == "extra_forbidden":
            parent = ".".join(str(p) for p in e["loc"][:-1])
            lines.append(
                f"{key}: unknown key; valid keys{' in ' + parent if parent else ''}: "
                f"{', '.join(_valid_keys(config_type, e['loc'][:-1]))}"
            )
        elif isinstance(e.get("input"), dict) and e["type"] == "value_error":  # a rule across a section's fields
            settable = f"{key}.<field>" if field_key == key else field_key
            lines.append(f"{key}: {e['msg'].removeprefix('Value error, ')}; fix it with --set {settable}=<value>")
        else:
            got = _shorten(redact(repr(e.get("input"))))  # a refused URL may hold a password: never echo it
            lines.append(
                f"{key}: {e['msg']} (got {got}); fix it with --set {field_key}=<value> or in the --config file"
            )
    return lines


def config_hash(config: BaseModel) -> str:
    """`sha256:<hex>` of the validated config: the lineage tag that says which settings produced a model."""
    return "sha256:" + hashlib.sha256(config.model_dump_json().encode()).hexdigest()


def field_at(config_type: type[BaseModel], key: str) -> Any | None:
    """The FieldInfo at a dotted key, or None when some part is not a field of a model section."""
    model: Any = config_type
    found = None
    for part in key.split("."):
        if not (isinstance(model, type) and issubclass(model, BaseModel)) or part not in model.model_fields:
            return None
        found = model.model_fields[part]
        model = found.annotation
    return found


_SCALAR_WORDS = {"int": "a whole number", "float": "a number", "bool": "true or false"}


def _typed(config_type: type[BaseModel], key: str, value: str) -> object:
    """A `--set` value as the field at `key` takes it: text as given, anything else parsed as YAML."""
    field = field_at(config_type, key)
    if field is not None and kind_of(field.annotation) == "text":
        return value
    section = field_at(config_type, key.rpartition(".")[0]) if "." in key else None
    if section is not None and get_origin(section.annotation) is dict and get_args(section.annotation)[1] is str:
        return value  # an entry of a text map (`env.NAME=1`): text as given
    try:
        return yaml.safe_load(value) if value else ""
    except yaml.YAMLError as err:
        shown = _shorten(redact(repr(value)))
        kind = kind_of(field.annotation) if field is not None else "any"
        if kind in _SCALAR_WORDS:  # no quoting makes a number of it
            raise ConfigError(f"--set {key}: takes {_SCALAR_WORDS[kind]}, got {shown}") from None
        where = getattr(err, "problem", None) or "not valid YAML"
        raise ConfigError(f"--set {key}: {where} in {shown}; quote text, e.g. --set '{key}=\"...\"'") from None


def text_problem(key: str, value: str) -> str | None:
    """Why text `value` may not be setting `key` (a `{{`, a NUL, too long, a credential in a URL), or None.

    The rules every text a run takes is held to, whichever way it enters: a config value, a workflow parameter a
    pipeline declares, a `-p` value of `retry` and `resubmit` (eksflow.parameters).
    """
    return next((why for _, why in _text_problems(value, key)), None)


def _text_problems(value: object, key: str = "") -> Iterator[tuple[str, str]]:
    """Every text value Argo would evaluate or that is too long to travel as one argv item, by dotted key."""
    if isinstance(value, BaseModel):
        for name in type(value).model_fields:
            yield from _text_problems(getattr(value, name), f"{key}.{name}" if key else name)
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from _text_problems(item, f"{key}[{i}]")
    elif isinstance(value, dict):
        for k, item in value.items():
            yield from _text_problems(str(k), f"{key} key")
            yield from _text_problems(item, f"{key}.{k}")
    elif isinstance(value, str):
        if "{{" in value:
            yield key, "holds '{{', which Argo would evaluate as an expression; remove it"
        if "\x00" in value:
            yield key, "holds a NUL character, which no command-line argument can carry; remove it"
        if len(value.encode()) > MAX_TEXT_BYTES:
            yield key, f"{len(value.encode())} bytes of text; at most {MAX_TEXT_BYTES} (put large content in a file)"
        if problem := url_setting_problem(key, value):
            yield key, problem


def _valid_keys(config_type: type[BaseModel], loc: tuple[int | str, ...]) -> list[str]:
    model: Any = config_type
    for part in loc:
        field = model.model_fields.get(part) if isinstance(part, str) else None
        if field is None or not isinstance(field.annotation, type):
            return []
        model = field.annotation
    return sorted(model.model_fields)


def _assign(tree: dict[str, Any], path: list[str], value: object) -> None:
    for part in path[:-1]:
        child = tree.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"--set {'.'.join(path)}: {part!r} is a value, not a section")
        tree = child
    tree[path[-1]] = value


def _shorten(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else f"{text[: limit - 20]}... ({len(text)} characters)"
