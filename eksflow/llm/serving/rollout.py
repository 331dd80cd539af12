"""The rollout as workflow tasks a user watches in the Argo UI (the last stage of a fine-tuning pipeline).

    prepare-fleet ─▶ vllm, vllm-service, vllm-pdb ─┐                  (starts as soon as the data is staged: the
    proxy-config ─▶ proxy, proxy-service, proxy-pdb ┤                  engine loads while the model trains)
    vllm-policy, proxy-policy ──────────────────────┴▶ serve-champion
    register + serve-champion ─▶ load-candidate ─▶ analyze-0 ─▶ shift-10 ─▶ analyze-10 ─▶ shift-50 ─▶
        analyze-50 ─▶ shift-100 ─▶ analyze-100 ─▶ promote   (skipped when the candidate is the champion already)

analyze-0 is the pre-traffic analysis: the probe rows straight to the candidate while its weight is 0, so a
candidate that fails it never answers a user.
    onExit: finish-rollout      (rolls back whatever did not reach promote: failed analysis, killed server, stop)

Inside `with Pipeline(...) as p:` a pipeline calls `rollout(cfg, model_version=...)` where the stage belongs, and
`finish_rollout(cfg)` inside `with p.on_exit():`. The serving objects (objects.py, policies.py) are applied by
Argo resource templates, one task each, in the order apply_order.py lists them (action apply, no owner reference:
the fleet outlives the workflow; the engine's task succeeds once a pod is available, i.e. its readiness probe
generated; the proxy's once applied, as its pods are ready only when the routes file routes the public name, which
serve-champion then waits for). Rollout steps reach the fleet by its
Service addresses; the keys come from the serving Secret mounted as files, and the steps that mount it carry
objects.ROLLOUT_LABEL, the label the fleet's NetworkPolicies admit. Canary weights come from `canary.weights`, one
shift/analyze pair each, after the pre-traffic analysis.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from eksflow import Pipeline, Ref, Resources, Section, Settings, TaskRef, resource, retry, task
from eksflow.llm.serving import apply_order, objects, servable
from eksflow.llm.serving.objects import ServingConfig
from eksflow.llm.steps import (
    canary,
    load_candidate,
    prepare_fleet,
    promote,
    publish_model,
    serve_champion,
    shift_traffic,
)
from eksflow.llm.steps import finish_rollout as finish_step
from eksflow.llm.steps.common.base_model import model_folder
from eksflow.llm.steps.common.chat_template import TemplateSettings
from eksflow.llm.steps.common.fleet_names import fleet_name
from eksflow.refs import When, ended

DEPLOYMENT_READY = "status.availableReplicas > 0"  # Argo waits for it: at least one pod passed its readiness probe
PREPARE_RESOURCES = Resources(cpu_request=1, memory_request="4Gi", memory_limit="8Gi")  # converts the base model
ANALYSIS_RESOURCES = Resources(cpu_request=1, memory_request="2Gi", memory_limit="4Gi")
ANSWER_TOKENS = 32  # the analysis' answer cap when evaluate's is 0 (from the references, a tokenizer the probe lacks)


@dataclass(frozen=True)
class Fleet(Section):
    """What every rollout step gets: the registry, the proxy, the adapters' folder, the state file, the keys."""

    model_name: str
    tracking_uri: str
    proxy_url: str
    serving_dir: str
    routes_file: str
    state_file: Ref
    secrets_dir: str  # in argv, so the local executor maps it to the run's volume


@dataclass(frozen=True)
class Engine(Section):
    """The fleet's vLLM engine, once prepare-fleet has named it: its Service, its base model folder, its LoRA cap.

    The Service twice: its address (vllm_url), and its name (fleet), whose endpoints list every replica.
    """

    vllm_url: Ref
    fleet: Ref
    base_dir: Ref
    max_lora_rank: int


def _fleet(cfg: ServingConfig) -> Fleet:
    return Fleet(
        model_name=cfg.model_name,
        tracking_uri=cfg.mlflow.tracking_uri,
        proxy_url=objects.proxy_url(cfg),
        serving_dir=objects.adapters_dir(cfg),
        routes_file=objects.routes_file(cfg),
        state_file=Pipeline.current().run_dir / "rollout" / "state.json",
        secrets_dir=objects.SECRETS_DIR,
    )


def _keyed(cfg: ServingConfig, step: ModuleType, *sections: Settings | Section, **values: Any) -> TaskRef:
    """A rollout step: the fleet's section, and the serving Secret (keys as files at Fleet.secrets_dir) mounted.

    The pod gets the label the fleet's NetworkPolicies admit: the steps holding the keys are the ones that talk to
    vLLM and the proxy, so the workflow's other pods (training, evaluation) cannot reach them.
    """
    return task(
        step,
        _fleet(cfg),
        *sections,
        labels={objects.ROLLOUT_LABEL: cfg.name},
        secrets={objects.SECRETS_DIR: cfg.serving.secret},
        **values,
    )


def _apply(
    name: str,
    manifest: dict[str, Any],
    after: TaskRef | Sequence[TaskRef],
    *,
    ready: bool = True,
    when: When | None = None,
) -> TaskRef:
    """A task applying one serving object: idempotent (a fleet already serving stays as it is), outliving the run."""
    return resource(
        name,
        manifest,
        action="apply",
        owned=False,
        success=DEPLOYMENT_READY if ready else None,
        after=after,
        when=when,
    )


def _applied(
    listed: Sequence[apply_order.FleetObject], first: TaskRef | Sequence[TaskRef], when: When | None = None
) -> list[TaskRef]:
    """A task for each object, in order: each after the object it names, or after `first`."""
    applied: dict[str, TaskRef] = {}
    for obj in listed:
        after = applied[obj.after] if obj.after else first
        applied[obj.task] = _apply(obj.task, obj.manifest, after, ready=obj.awaited, when=when)
    return list(applied.values())


def _delete_fleet(prefix: str, fleet: Ref, when: Ref, after: TaskRef) -> list[TaskRef]:
    """Tasks deleting whole-model fleet `fleet` (a task output) after `after`, when `when` (its bool output) holds."""
    return [
        resource(
            f"{prefix}-{kind.lower()}",
            {"apiVersion": api, "kind": kind, "metadata": {"name": fleet}},
            action="delete",
            owned=False,
            after=after,
            when=when,
        )
        for api, kind in apply_order.FLEET_KINDS
    ]


def rollout(
    cfg: ServingConfig,
    *,
    model_version: Ref | str,
    base_model: Ref | str,
    evaluated_champion: Ref | str | None = None,
    start_after: TaskRef | Sequence[TaskRef] = (),
    start_when: When | None = None,
    candidate_after: TaskRef | Sequence[TaskRef] = (),
    max_new_tokens: int = 0,
    chat_template: TemplateSettings | None = None,
) -> TaskRef:
    """Add the rollout's tasks to the pipeline being built; returns `promote`.

    The fleet starts after `start_after` (if `start_when` holds), the candidate loads after `candidate_after`
    and once the champion is served; `model_version` and `evaluated_champion` are values or task outputs.
    `evaluated_champion` is evaluate's champion_version: the rollout stops if `champion` is no longer that version
    ("" included: a champion appeared since). Left out (None) only where no evaluation judged the candidate.
    `chat_template` is train's (train.chat_template): the fleet's engine applies it, on a fleet of its own when set.
    A config whose training registers whole models (servable.registered_kind: a full fine-tune, or an adapter merged
    into its base) gets each served by a fleet of its own (the champion's too, when it is one), and no base model
    fleet runs.
    """
    after = [candidate_after] if isinstance(candidate_after, TaskRef) else list(candidate_after)
    judged = {} if evaluated_champion is None else {"evaluated_champion": evaluated_champion}
    candidate_args = {
        "model_version": model_version,
        **judged,
        "base_model": base_model,
        "workflow_name": Pipeline.current().workflow_name,
    }
    whole_models = servable.registered_kind(cfg) == "model"
    if whole_models:
        candidate, engine = _whole_models(cfg, candidate_args, after, start_after, start_when)
    else:
        candidate, engine = _adapters(cfg, candidate_args, after, start_after, start_when, chat_template)

    def analysis(percent: float, after: TaskRef, when: When | None = None) -> TaskRef:
        return _keyed(
            cfg,
            canary,
            cfg.canary,
            engine,
            percent=percent,
            report_dir=Pipeline.current().run_dir / "reports",
            max_new_tokens=max_new_tokens or ANSWER_TOKENS,
            task_name=f"analyze-{canary.step_label(percent)}",
            resources=ANALYSIS_RESOURCES,
            # Never retried: an analysis is a measurement, and measuring until it passes would defeat the gate.
            retry_strategy=retry(0),
            after=after,
            when=when,
        )

    # Pre-traffic: weight 0, the probes straight to the candidate. Skipped when the candidate is the champion
    # already; every later step runs after it succeeded, so they are left out too.
    previous = analysis(0, candidate, when=candidate.rolls_out)
    for percent in cfg.canary.weights:  # shift-10 -> analyze-10 -> shift-50 -> ...
        label = canary.step_label(percent)
        shifted = _keyed(cfg, shift_traffic, engine, percent=percent, task_name=f"shift-{label}", after=previous)
        previous = analysis(percent, shifted)
    promoted = _keyed(cfg, promote, engine, after=previous)
    if whole_models:  # the former champion's own fleet, if it had one
        _delete_fleet("retire", promoted.retired, promoted.retires, promoted)
    return promoted


def _adapters(
    cfg: ServingConfig,
    candidate_args: dict[str, Any],
    after: list[TaskRef],
    start_after: TaskRef | Sequence[TaskRef],
    start_when: When | None,
    chat_template: TemplateSettings | None,
) -> tuple[TaskRef, Engine]:
    """The base model's fleet, the champion's adapter on it, then the candidate's: load-candidate and the engine."""
    prepared = task(
        prepare_fleet,
        chat_template or TemplateSettings(),
        base_model=candidate_args["base_model"],
        model_cache_dir=cfg.storage.model_cache,
        pipeline=cfg.name,
        namespace=cfg.namespace,
        port=cfg.serving.port,
        serving_dir=objects.adapters_dir(cfg),
        resources=PREPARE_RESOURCES,
        after=start_after,
        when=start_when,
    )
    fleet, model_dir = str(prepared.fleet), str(prepared.model_dir)  # wired by resource() as the tasks' inputs
    applied = _applied(apply_order.fleet_objects(cfg, fleet, model_dir), prepared)
    engine = Engine(prepared.vllm_url, prepared.fleet, prepared.model_dir, cfg.serving.engine.max_lora_rank)
    champion = _keyed(cfg, serve_champion, engine, after=applied)
    return _keyed(cfg, load_candidate, engine, **candidate_args, after=[*after, champion]), engine


def _whole_models(
    cfg: ServingConfig,
    candidate_args: dict[str, Any],
    after: list[TaskRef],
    start_after: TaskRef | Sequence[TaskRef],
    start_when: When | None,
) -> tuple[TaskRef, Engine]:
    """The proxy, then the champion's and the candidate's own fleets (each when it is a whole model), loaded in turn.

    publish-<role> downloads a whole-model version to the models folder and names its fleet; its objects are
    applied when it is one (kind model), and serve-champion and load-candidate route a slot to it. A champion that
    is an adapter has no fleet here: the rollout goes on without a live champion. The objects of a fleet that was not
    applied are skipped, and the step after them runs all the same (ended): it finds the fleet's address empty.
    """
    shared = _applied(apply_order.shared_objects(cfg), start_after, start_when)

    def published(
        role: str, version: dict[str, Any], after: TaskRef | Sequence[TaskRef]
    ) -> tuple[TaskRef, Engine, list[TaskRef]]:
        made = task(
            publish_model,
            model_name=cfg.model_name,
            tracking_uri=cfg.mlflow.tracking_uri,
            models_dir=objects.models_dir(cfg),
            pipeline=cfg.name,
            namespace=cfg.namespace,
            port=cfg.serving.port,
            task_name=f"publish-{role}",
            after=after,
            when=start_when,
            **version,
        )
        listed = apply_order.engine_objects(
            cfg, str(made.fleet), str(made.model_dir), str(made.served_name), prefix=role
        )
        fleet = _applied(listed, made, when=made.own_fleet)
        engine = Engine(made.vllm_url, made.fleet, made.model_dir, cfg.serving.engine.max_lora_rank)
        return made, engine, [ended(t) for t in fleet]

    champion_made, champion_engine, champion_fleet = published("champion", {"alias": "champion"}, start_after)
    champion = _keyed(
        cfg,
        serve_champion,
        champion_engine,
        served_name=champion_made.served_name,
        after=[*shared, *champion_fleet],
    )
    candidate_made, engine, candidate_fleet = published(
        "candidate", {"model_version": candidate_args["model_version"]}, [*after, champion]
    )
    candidate = _keyed(
        cfg,
        load_candidate,
        engine,
        **candidate_args,
        served_name=candidate_made.served_name,
        after=[candidate_made, *candidate_fleet],
    )
    return candidate, engine


def finish_rollout(cfg: ServingConfig) -> TaskRef:
    """The exit handler's task (inside `with p.on_exit():`): roll back whatever did not reach promote.

    The exit handler cannot read the main DAG's task outputs: the fleet's address comes from the state file. A
    whole-model candidate rolled back has its own fleet deleted after it.
    """
    finished = _keyed(cfg, finish_step, workflow_status=Pipeline.current().workflow_status)
    if servable.registered_kind(cfg) == "model":
        _delete_fleet("discard", finished.discarded, finished.discards, finished)
    return finished


def gitops_objects(cfg: ServingConfig) -> list[dict[str, Any]]:
    """The serving objects for the configured base model, for `make templates` (workflow-templates/serving.yaml).

    The NetworkPolicies first (a stable sort keeps the rest in apply order): `kubectl apply -f` applies in file
    order, so they are in place before the pods they guard.
    """
    fleet = fleet_name(cfg.name, cfg.base_model)
    model_dir = str(model_folder(cfg.base_model, Path(cfg.storage.model_cache)))
    ordered = sorted(
        apply_order.fleet_objects(cfg, fleet, model_dir), key=lambda o: o.manifest["kind"] != "NetworkPolicy"
    )
    return [obj.manifest for obj in ordered]


def rollout_pipeline(cfg: ServingConfig) -> Pipeline:
    """Roll out an already registered version (workflow parameter `model_version`) on the fleet of `base_model`.

    The same tasks as a pipeline's last stage, without training: to retry a rollout, or to roll a version out on
    a fleet again. Its canary compares with the served champion; `evaluate`'s comparison is not re-checked.
    """
    with Pipeline(
        cfg,
        title=f"roll out {cfg.model_name}",
        description="fleet -> load candidate -> canary steps -> promote",
        parameters={"model_version": "", "base_model": cfg.base_model},
    ) as p:
        rollout(cfg, model_version=p.parameters.model_version, base_model=p.parameters.base_model)
        with p.on_exit():
            finish_rollout(cfg)
    return p
