"""Step tasks and the Workflow around them: every step template renders the same way (no hand-built YAML).

`task(step, settings, **values)` adds a task running `python -m <step module>`. Its argv comes from the step's own
Args model: literal values become `--name=value` items (checked against the field's type now, not at run time),
references to other tasks' outputs become input parameters filled by the DAG. Output parameters are the fields of
the step's Outputs model, read from files; output artifacts are the files its contract's `ARTIFACTS` names. The
template also says which arguments hold container paths (annotation `eksflow.dev/path-args`), so the local
executor maps exactly those to host folders.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Annotated, Any

from hera.workflows import (
    Artifact,
    Container,
    Env,
    NoneArchiveStrategy,
    Parameter,
    Resources,
    RetryStrategy,
)
from hera.workflows import models as m
from pydantic import BaseModel, TypeAdapter, ValidationError
from pydantic.fields import FieldInfo

from eksflow.errors import EXIT_BAD_INPUT, PipelineError
from eksflow.kinds import Kind, accepts, kind_of
from eksflow.pipeline import Pipeline, literal_problem, step_name
from eksflow.pods import checked_annotations, checked_labels, secret_volumes
from eksflow.refs import Ref, TaskRef, When
from eksflow.runtime.args import Settings, StepArgs, flag, is_location, to_argv
from eksflow.sections import Section, section_values
from eksflow.step_code import step_sources

if TYPE_CHECKING:
    from eksflow.config import PipelineConfig

OUTPUTS_DIR = "/tmp/outputs"  # steps write one file per output parameter here
FSX_VOLUME = "fsx"
PATH_ARGS_ANNOTATION = "eksflow.dev/path-args"  # the argv flags holding container paths: the only ones mapped locally
# The Kubernetes "restricted" Pod Security Standard.
RESTRICTED = m.SecurityContext(
    run_as_non_root=True,
    run_as_user=1000,
    allow_privilege_escalation=False,
    capabilities=m.Capabilities(drop=["ALL"]),
    seccomp_profile=m.SeccompProfile(type="RuntimeDefault"),
)
SMALL = Resources(cpu_request=1, cpu_limit=2, memory_request="2Gi", memory_limit="4Gi")


def retry(limit: int = 2, *, first_delay: str = "10s", max_delay: str = "5m") -> RetryStrategy:
    """Retry everything but bad input (exit 2), with exponential backoff between `first_delay` and `max_delay`.

    No `maxDuration`: Argo counts it from the first attempt's start, so a step that fails after running longer
    than it (training preempted after an hour: the case retries exist for) would never be retried.
    """
    return RetryStrategy(
        limit=str(limit),
        retry_policy="Always",
        expression=f"asInt(lastRetry.exitCode) != {EXIT_BAD_INPUT}",
        backoff=m.Backoff(duration=first_delay, factor="2", cap=max_delay),
    )


def step_retry(cfg: PipelineConfig) -> RetryStrategy:
    """The retry strategy of a step that sets none: the config's `retry` section."""
    return retry(cfg.retry.limit, first_delay=cfg.retry.first_delay, max_delay=cfg.retry.max_delay)


TASK_OPTIONS = frozenset(
    {
        "task_name",
        "after",
        "when",
        "container_image",
        "resources",
        "retry_strategy",
        "prometheus",
        "memoize",
        "labels",
        "annotations",
        "node_selector",
        "secrets",
        "active_deadline_seconds",
        "step",
    }
)


def task(
    step: ModuleType,
    *sections: Settings | Section,
    task_name: str | None = None,
    after: TaskRef | Sequence[TaskRef] = (),
    when: When | None = None,
    container_image: str | None = None,
    resources: Resources = SMALL,
    retry_strategy: RetryStrategy | None = None,
    prometheus: m.Metrics | None = None,
    memoize: Sequence[Ref | TaskRef] = (),
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    node_selector: Mapping[str, str] | None = None,
    secrets: Mapping[str, str] | None = None,
    active_deadline_seconds: int | None = None,
    **values: Any,
) -> TaskRef:
    """Add a task running `python -m <step>` to the pipeline being built; its outputs are attributes of the result.

    `sections` and `values` fill the step's Args (eksflow.sections: a config section gives every field, a shared
    Section the fields the step takes; a keyword wins over a section); a value may be a literal or a Ref (another
    task's output, a workflow parameter, `p.run_dir / ...`). The other keywords are the task's own options (a
    step whose Args has a field of one of these names is refused: rename the field). Without `retry_strategy`
    the config's `retry` section applies; the step's declared GAUGES are emitted besides `prometheus`. `labels`,
    `annotations` and `node_selector` go on the pod; `secrets` mounts Secrets read-only: {mount path: Secret name};
    all literal text, checked now by Kubernetes' rules (eksflow.pods). `active_deadline_seconds` stops an attempt
    that runs longer (Argo's field, honoured by `run` as well).

    `memoize` lists what, besides this task's own step code, settings and image, decides its result: content keys
    (task outputs that name data by digest, letters, digits and '-' only) and upstream tasks (their step code and
    settings). With `memoize=[staged.data_key]` a later run on the same data reuses this task's outputs (Argo's
    memoize; the config's `memoize: false` turns it off).
    """
    pipeline = Pipeline.current()
    name = task_name or step_name(step)
    args_type, outputs = contract(step)
    argv, inputs = arguments(args_type, name, sections, values)
    image = container_image or pipeline.cfg.image
    fingerprint = template_fingerprint(step, image, argv, memoize, pipeline.parameter_values)
    memo, memo_inputs = memoization(pipeline.cfg, name, fingerprint, memoize)
    inputs = {**inputs, **memo_inputs}
    where = f"task {name!r}"
    folders = {pipeline.cfg.storage.fsx_mount: "the FSx volume", OUTPUTS_DIR: "the outputs folder"}
    container = Container(
        name=name,
        image=image,
        command=["python", "-m", step.__name__],
        args=argv,
        inputs=[Parameter(name=arg) for arg in inputs] or None,
        outputs=[
            *(Parameter(name=output, value_from=m.ValueFrom(path=f"{OUTPUTS_DIR}/{output}")) for output in outputs),
            *output_artifacts(step),
        ],
        env=[
            *(Env(name=env_name, value=value) for env_name, value in pipeline.cfg.env.items()),
            Env(name="EKSFLOW_IMAGE", value=image),  # lineage: the image a model was registered from
        ],
        volumes=secret_volumes(secrets, folders, {FSX_VOLUME}, where) or None,
        volume_mounts=[m.VolumeMount(name=FSX_VOLUME, mount_path=pipeline.cfg.storage.fsx_mount)],
        resources=resources,
        retry_strategy=retry_strategy or step_retry(pipeline.cfg),
        security_context=RESTRICTED,
        metrics=merged_metrics(step_gauges(pipeline.cfg, step, name), prometheus),
        labels=checked_labels("labels", labels, where) or None,
        annotations=checked_annotations(annotations, path_annotation(args_type), where) or None,
        node_selector=checked_labels("node_selector", node_selector, where) or None,
        active_deadline_seconds=active_deadline_seconds,
        memoize=memo,
    )
    return pipeline.add(
        name, container, step=step.__name__, outputs=outputs, inputs=inputs, after=after, when=when,
        fingerprint=fingerprint,
    )  # fmt: skip


def step_gauges(cfg: PipelineConfig, step: ModuleType, task_name: str) -> m.Metrics | None:
    """The Prometheus gauges the step's contract declares: `GAUGES = {output: help}`, one `<task>_<output>` each."""
    declared: Mapping[str, str] = getattr(step, "GAUGES", None) or {}
    outputs = contract(step)[1]
    unknown = sorted(set(declared) - set(outputs))
    if unknown:
        raise PipelineError(f"{step.__name__}.GAUGES names {', '.join(unknown)}, which are not among its Outputs")
    prefix = task_name.replace("-", "_")
    values = {
        f"{prefix}_{output}": (help_text, f"{{{{outputs.parameters.{output}}}}}")
        for output, help_text in declared.items()
    }
    return gauges(cfg, **values) if values else None


def merged_metrics(*metrics: m.Metrics | None) -> m.Metrics | None:
    """One `metrics` of a template from several (a step's gauges and the task's own)."""
    prometheus = [gauge for found in metrics if found is not None for gauge in found.prometheus or []]
    return m.Metrics(prometheus=prometheus) if prometheus else None


def template_fingerprint(
    step: ModuleType, image: str, argv: Sequence[str], memoize: Sequence[Ref | TaskRef], parameters: Mapping[str, str]
) -> str:
    """A short hash of what makes this task's result, known when the pipeline is built.

    The code the step runs from the project (step_code: its module and the project modules it imports; in the
    cluster also its image), the image and argv as templates (settings; per-run values stay `{{...}}` placeholders,
    the same text in every run), the configured values of the workflow parameters it reads, and the fingerprints of
    the upstream tasks `memoize` names. A parameter overridden at submit time (`argo submit -p`) is not part of the
    key: turn memoize off for such runs.
    """
    digest = hashlib.sha256()
    used = {
        name: value
        for name, value in sorted(parameters.items())
        if f"{{{{workflow.parameters.{name}}}}}" in "".join(argv)
    }
    for part in (step.__name__, image, *argv, *(f"{k}={v}" for k, v in used.items()), *step_sources(step)):
        digest.update(part.encode() + b"\0")
    for upstream in memoize:
        if isinstance(upstream, TaskRef):
            digest.update(upstream._fingerprint.encode())
    return digest.hexdigest()[:16]


def memoization(
    cfg: PipelineConfig, name: str, fingerprint: str, memoize: Sequence[Ref | TaskRef]
) -> tuple[m.Memoize | None, dict[str, Ref]]:
    """Argo's memoize for a task (None when off or nothing is listed) and the input parameters its key reads."""
    if not memoize or not cfg.memoize:
        return None, {}
    inputs = {f"memo_key_{i}": ref for i, ref in enumerate(r for r in memoize if isinstance(r, Ref))}
    key = "-".join([name, fingerprint, *(f"{{{{inputs.parameters.{param}}}}}" for param in inputs)])
    cache = m.Cache(config_map=m.LocalObjectReference(name=f"eksflow-memo-{cfg.name}"))
    return m.Memoize(key=key, max_age=cfg.memoize_max_age, cache=cache), inputs


def output_artifacts(step: ModuleType) -> list[Artifact]:
    """The step's output artifacts: `ARTIFACTS = {name: file}` in its contract module, files in its outputs folder.

    Uploaded unarchived, so the Argo UI can show them (HTML, images); optional, so a step that failed before
    writing one fails for its own reason.
    """
    declared: dict[str, str] = getattr(step, "ARTIFACTS", None) or {}
    return [
        Artifact(name=name, path=f"{OUTPUTS_DIR}/{file}", archive=NoneArchiveStrategy(), optional=True)
        for name, file in declared.items()
    ]


def contract(step: ModuleType) -> tuple[type[StepArgs], dict[str, Kind]]:
    """The step module's Args model and its outputs with their kinds; PipelineError if it is not a step."""
    args_type = getattr(step, "Args", None)
    outputs_type = getattr(step, "Outputs", None)
    if not (isinstance(args_type, type) and issubclass(args_type, StepArgs)):
        raise PipelineError(f"{step.__name__} is not a step: it needs `class Args(StepArgs)` (eksflow.runtime)")
    if not (isinstance(outputs_type, type) and issubclass(outputs_type, BaseModel)):
        raise PipelineError(f"{step.__name__} is not a step: it needs `class Outputs(BaseModel)`")
    return args_type, {n: kind_of(f.annotation) for n, f in outputs_type.model_fields.items()}


def arguments(
    args_type: type[StepArgs],
    task_name: str,
    sections: Sequence[Settings | Section],
    values: Mapping[str, object],
    *,
    outputs_dir: str = OUTPUTS_DIR,
) -> tuple[list[str], dict[str, Ref]]:
    """The template's argv and its inputs: every value checked against the step's field, now.

    A Ref valid anywhere (a workflow parameter, the run folder) goes straight into argv; a task output or a
    fan-out item becomes an input parameter, `{{inputs.parameters.<field>}}` in argv.
    """
    fields = args_type.model_fields
    where = f"task {task_name!r} ({args_type.__module__})"
    taken = sorted(TASK_OPTIONS & set(fields))
    if taken:
        raise PipelineError(f"{where}: its Args field(s) {', '.join(taken)} clash with task() options; rename them")
    given = section_values(sections, fields, where)
    given.update(values)
    unknown = sorted(set(given) - set(fields) - {"outputs_dir"})
    if unknown:
        raise PipelineError(f"{where}: no argument {', '.join(unknown)}; its arguments: {', '.join(fields)}")
    missing = sorted(n for n, f in fields.items() if f.is_required() and n not in given)
    if missing:
        raise PipelineError(f"{where}: missing required argument {', '.join(missing)}")
    rendered: dict[str, object] = {}
    inputs: dict[str, Ref] = {}
    for field_name, value in given.items():
        field = fields[field_name]
        if isinstance(value, Ref):
            target = kind_of(field.annotation)
            if not accepts(target, value.kind):
                raise PipelineError(f"{where}: argument {field_name} takes {target}, but {value.label} is {value.kind}")
            for known in value.values or ():  # fan-out items: each must pass the step's rules, as a literal does
                try:
                    _adapter(field).validate_python(known)
                except ValidationError as err:
                    raise PipelineError(
                        f"{where}: argument {field_name}={known!r} (from {value.label}): {err.errors()[0]['msg']}"
                    ) from None
            if value.producer is None and value.dag is None:
                rendered[field_name] = value.argo
            else:
                inputs[field_name] = value
                rendered[field_name] = f"{{{{inputs.parameters.{field_name}}}}}"
            continue
        try:
            _adapter(field).validate_python(value)
        except ValidationError as err:
            raise PipelineError(f"{where}: argument {field_name}={value!r}: {err.errors()[0]['msg']}") from None
        if problem := literal_problem(value):
            raise PipelineError(f"{where}: argument {field_name} {problem}")
        rendered[field_name] = value
    rendered["outputs_dir"] = outputs_dir
    return to_argv(rendered), inputs


def _adapter(field: FieldInfo) -> TypeAdapter[Any]:
    """Validates a value as the field would, constraints (ge, pattern, ...) included."""
    annotation: Any = field.annotation
    return TypeAdapter(Annotated[(annotation, *field.metadata)] if field.metadata else annotation)


def path_annotation(args_type: type[StepArgs]) -> dict[str, str]:
    """`eksflow.dev/path-args`: the flags whose values are container paths or URIs holding one."""
    flags = [flag(n) for n, f in args_type.model_fields.items() if is_location(f)]
    return {PATH_ARGS_ANNOTATION: ",".join(flags)} if flags else {}


def gauges(cfg: PipelineConfig, **values: tuple[str, str]) -> m.Metrics:
    """Prometheus gauges (`name=(help, value)`) the controller emits when the template succeeds."""
    return m.Metrics(
        prometheus=[
            m.Prometheus(
                name=f"eksflow_{name}",
                help=help_text,
                labels=[m.MetricLabel(key="pipeline", value=cfg.name)],
                gauge=m.Gauge(value=value, realtime=False),
                when="{{status}} == Succeeded",
            )
            for name, (help_text, value) in values.items()
        ]
    )
