"""One factory for every step template, so each step renders the same way (STYLE.md: no hand-built YAML).

A step template is a Container running `python -m steps.<module>`. Its argv comes from the step's own Args model:
config values become `--name=value` items, and the names listed as `wired` become input parameters that the DAG
fills from upstream outputs. Output parameters are the fields of the step's Outputs model, read from files.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from types import ModuleType
from typing import Any

from hera.workflows import Container, Env, Parameter, Resources, RetryStrategy, Task, Workflow
from hera.workflows import models as m

from eksflow.config import PipelineConfig
from eksflow.runtime.args import EXIT_BAD_INPUT, Settings, to_argv

OUTPUTS_DIR = "/tmp/outputs"  # steps write one file per output parameter here
FSX_VOLUME = "fsx"
# Bad input (exit 2) fails fast; anything else (OOM, Spot preemption, a flaky server) is retried with backoff.
STEP_RETRY = RetryStrategy(
    limit="2",
    retry_policy="Always",
    expression=f"asInt(lastRetry.exitCode) != {EXIT_BAD_INPUT}",
    backoff=m.Backoff(duration="10s", factor="2", max_duration="5m"),
)
# The Kubernetes "restricted" Pod Security Standard.
RESTRICTED = m.SecurityContext(
    run_as_non_root=True,
    run_as_user=1000,
    allow_privilege_escalation=False,
    capabilities=m.Capabilities(drop=["ALL"]),
    seccomp_profile=m.SeccompProfile(type="RuntimeDefault"),
)
SMALL = Resources(cpu_request=1, cpu_limit=2, memory_request="2Gi", memory_limit="4Gi")


class StepTemplate:
    """A step's Container template; calling it inside a DAG adds a task (typed, unlike Hera's Step | Task | None)."""

    def __init__(self, container: Container) -> None:
        self.container = container

    def __call__(self, *, arguments: Mapping[str, Any] | None = None, when: str | None = None) -> Task:
        """Add a task running this template to the enclosing DAG."""
        task = self.container(arguments=dict(arguments or {}), when=when)
        if not isinstance(task, Task):
            raise TypeError(f"template {self.container.name!r} must be called inside `with DAG(...)`")
        return task


StepFactory = Callable[..., StepTemplate]


def template_name(module: ModuleType) -> str:
    """`steps.stage_data` -> `stage-data` (Argo names are kebab-case, derived, never typed by hand)."""
    return module.__name__.rsplit(".", 1)[-1].replace("_", "-")


def step_factory(cfg: PipelineConfig) -> StepFactory:
    """A `step(module, settings, wired=..., **values)` function bound to this config's images and storage."""

    def step(
        module: ModuleType,
        settings: Settings | None = None,
        *,
        wired: Sequence[str] = (),
        image: str | None = None,
        resources: Resources = SMALL,
        metrics: m.Metrics | None = None,
        **values: object,
    ) -> StepTemplate:
        """Container template for `python -m steps.<module>` with its argv rendered from the step's Args."""
        image = image or cfg.images.steps
        return StepTemplate(
            Container(
                name=template_name(module),
                image=image,
                command=["python", "-m", module.__name__],
                args=step_argv(module, settings, wired=wired, outputs_dir=OUTPUTS_DIR, **values),
                inputs=[Parameter(name=name) for name in wired],
                outputs=[
                    Parameter(name=name, value_from=m.ValueFrom(path=f"{OUTPUTS_DIR}/{name}"))
                    for name in module.Outputs.model_fields
                ],
                env=[
                    Env(name="HF_HUB_OFFLINE", value="1"),  # nothing downloads from a model hub at run time
                    Env(name="EKSFLOW_IMAGE", value=image),  # lineage: the image a model was registered from
                ],
                volume_mounts=[m.VolumeMount(name=FSX_VOLUME, mount_path=cfg.storage.fsx_mount)],
                resources=resources,
                retry_strategy=STEP_RETRY,
                security_context=RESTRICTED,
                metrics=metrics,
            )
        )

    return step


def step_argv(
    module: ModuleType,
    settings: Settings | None = None,
    *,
    wired: Sequence[str] = (),
    outputs_dir: str = OUTPUTS_DIR,
    **values: object,
) -> list[str]:
    """`--name=value` items for the step's Args: settings, then values, then wired inputs as `{{inputs...}}`."""
    fields = module.Args.model_fields
    rendered: dict[str, object] = {}
    if settings is not None:
        rendered.update({name: getattr(settings, name) for name in type(settings).model_fields})
    rendered.update(values)
    rendered.update({name: f"{{{{inputs.parameters.{name}}}}}" for name in wired})
    rendered["outputs_dir"] = outputs_dir
    unknown = sorted(set(rendered) - set(fields))
    missing = sorted(n for n, f in fields.items() if f.is_required() and n not in rendered)
    if unknown or missing:
        raise TypeError(f"{module.__name__}: unknown args {unknown}, missing required args {missing}")
    return to_argv(rendered)


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


@contextmanager
def pipeline_workflow(
    cfg: PipelineConfig, *, title: str, description: str, parameters: Mapping[str, str]
) -> Iterator[Workflow]:
    """The Workflow every pipeline shares: FSx volume, service account, workflow parameters, cleanup policies."""
    with Workflow(
        generate_name=f"{cfg.name}-",
        namespace=cfg.namespace,
        entrypoint="main",
        service_account_name=cfg.service_account,
        annotations={"workflows.argoproj.io/title": title, "workflows.argoproj.io/description": description},
        labels={"app.kubernetes.io/part-of": "eksflow", "eksflow.dev/pipeline": cfg.name},
        arguments=[Parameter(name=name, value=value) for name, value in parameters.items()],
        volumes=[
            m.Volume(
                name=FSX_VOLUME,
                persistent_volume_claim=m.PersistentVolumeClaimVolumeSource(claim_name=cfg.storage.fsx_claim),
            )
        ],
        pod_gc=m.PodGC(strategy="OnPodSuccess"),
        ttl_strategy=m.TTLStrategy(seconds_after_success=7 * 24 * 3600, seconds_after_failure=14 * 24 * 3600),
        active_deadline_seconds=24 * 3600,
    ) as workflow:
        yield workflow


def manifest(workflow: Workflow) -> dict[str, Any]:
    """The Workflow as the plain dict that `render` prints, `submit` sends and `run` executes."""
    rendered: dict[str, Any] = workflow.to_dict()
    return rendered


KINDS = ("Workflow", "WorkflowTemplate", "CronWorkflow")
CRON_STARTING_DEADLINE_S = 600  # a schedule missed by more than this (controller down) is skipped, not run late


def workflow_template(workflow: Mapping[str, Any]) -> dict[str, Any]:
    """The Workflow as a WorkflowTemplate named after the pipeline (what `argo submit --from` and crons run)."""
    metadata = dict(workflow["metadata"])
    metadata["name"] = metadata.pop("generateName").rstrip("-")
    return {
        "apiVersion": workflow["apiVersion"],
        "kind": "WorkflowTemplate",
        "metadata": metadata,
        "spec": workflow["spec"],
    }


def cron_workflow(workflow: Mapping[str, Any], cron: str, timezone: str | None = None) -> dict[str, Any]:
    """A CronWorkflow running the pipeline's WorkflowTemplate: one run at a time, late runs skipped.

    It passes `retrain=if-data-changed`: a scheduled run trains only when the data differs from the champion's.
    """
    template = workflow_template(workflow)
    name = template["metadata"]["name"]
    spec: dict[str, Any] = {
        "schedules": [cron],
        "concurrencyPolicy": "Forbid",  # a long training run is never overlapped by the next one
        "startingDeadlineSeconds": CRON_STARTING_DEADLINE_S,
        "successfulJobsHistoryLimit": 3,
        "failedJobsHistoryLimit": 3,
        "workflowMetadata": {"labels": dict(template["metadata"].get("labels", {}))},
        "workflowSpec": {
            "workflowTemplateRef": {"name": name},
            # a scheduled run trains only on new data; `argo submit --from workflowtemplate/...` keeps the default
            "arguments": {"parameters": [{"name": "retrain", "value": "if-data-changed"}]},
        },
    }
    if timezone:
        spec["timezone"] = timezone
    metadata = {k: v for k, v in template["metadata"].items() if k in ("name", "namespace", "labels", "annotations")}
    return {"apiVersion": workflow["apiVersion"], "kind": "CronWorkflow", "metadata": metadata, "spec": spec}
