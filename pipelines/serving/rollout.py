"""The rollout as workflow tasks a user watches in the Argo UI (the last stage of a fine-tuning pipeline).

    prepare-fleet ─▶ vllm, vllm-service, vllm-pdb ─┐                  (starts as soon as the data is staged: the
    proxy-config ─▶ proxy, proxy-service, proxy-pdb ┤                  engine loads while the model trains)
    vllm-policy, proxy-policy ──────────────────────┴▶ serve-champion
    register + serve-champion ─▶ load-candidate ─▶ shift-10 ─▶ analyze-10 ─▶ shift-50 ─▶ analyze-50 ─▶
        shift-100 ─▶ analyze-100 ─▶ promote
    onExit: finish-rollout      (rolls back whatever did not reach promote: failed analysis, killed server, stop)

Inside `with Pipeline(...) as p:` a pipeline calls `rollout(cfg, model_version=...)` where the stage belongs, and
`finish_rollout(cfg)` inside `with p.on_exit():`. The serving objects (objects.py) are applied by Argo resource
templates (action apply, no owner reference: the fleet outlives the workflow; a Deployment's task succeeds once a
pod is available, i.e. its readiness probe generated). Rollout steps reach the fleet by its Service addresses; the
keys come from the serving Secret mounted as files, and the steps that mount it carry objects.ROLLOUT_LABEL, the
label the fleet's NetworkPolicies admit. Canary weights come from `canary.weights`, one shift/analyze
pair each.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hera.workflows import Parameter, Resource, Resources
from hera.workflows import models as m

from eksflow import Pipeline, Ref, TaskRef, retry, task
from eksflow.manifests import manifest_text
from eksflow.refs import When
from pipelines.serving import objects
from pipelines.serving.objects import ServingConfig
from steps import canary, load_candidate, prepare_fleet, promote, serve_champion, shift_traffic
from steps import finish_rollout as finish_step
from steps.common.base_model import model_folder
from steps.prepare_fleet import fleet_name

DEPLOYMENT_READY = "status.availableReplicas > 0"  # Argo waits for it: at least one pod passed its readiness probe
PREPARE_RESOURCES = Resources(cpu_request=1, memory_request="4Gi", memory_limit="8Gi")  # converts the base model
ANALYSIS_RESOURCES = Resources(cpu_request=1, memory_request="2Gi", memory_limit="4Gi")
ANSWER_TOKENS = 32  # the analysis' answer cap when evaluate's is 0 (from the references, a tokenizer the probe lacks)


def _fleet_args(cfg: ServingConfig) -> dict[str, Any]:
    """What every rollout step gets: the registry, the Services, the adapters' folder, the state file, the keys."""
    p = Pipeline.current()
    return {
        "model_name": cfg.model_name,
        "tracking_uri": cfg.mlflow.tracking_uri,
        "proxy_url": objects.proxy_url(cfg),
        "serving_dir": f"{cfg.storage.fsx_mount}/serving/{cfg.model_name}/adapters",
        "state_file": p.run_dir / "rollout" / "state.json",
        "secrets_dir": objects.SECRETS_DIR,  # in argv, so the local executor maps it to the run's volume
    }


def _keyed(cfg: ServingConfig, added: TaskRef) -> TaskRef:
    """Mount the serving Secret (keys as files at FleetArgs.secrets_dir), read-only, into the task's container.

    The pod gets the label the fleet's NetworkPolicies admit: the steps holding the keys are the ones that talk to
    vLLM and the proxy, so the workflow's other pods (training, evaluation) cannot reach them.
    """
    secret = cfg.serving.secret
    container: Any = Pipeline.current().templates[added._name]
    container.labels = {**(container.labels or {}), objects.ROLLOUT_LABEL: cfg.name}
    container.volumes = [m.Volume(name=secret, secret=m.SecretVolumeSource(secret_name=secret, default_mode=0o440))]
    container.volume_mounts = [
        *(container.volume_mounts or []),
        m.VolumeMount(name=secret, mount_path=objects.SECRETS_DIR, read_only=True),
    ]
    return added


def _apply(
    name: str, manifest: Mapping[str, Any], inputs: Mapping[str, Ref], after: TaskRef, *, ready: bool = True
) -> TaskRef:
    """A task applying one serving object (idempotent: a fleet already serving is left as it is)."""
    template = Resource(
        name=name,
        action="apply",
        manifest=manifest_text(manifest),  # fleet and model_dir as JSON-encoding expressions, never as text
        success_condition=DEPLOYMENT_READY if ready else None,
        inputs=[Parameter(name=i) for i in inputs] or None,
    )
    kind = str(manifest["kind"])
    return Pipeline.current().add(name, template, step=kind, outputs={}, inputs=inputs, after=after)


def rollout(
    cfg: ServingConfig,
    *,
    model_version: Ref | str,
    base_model: Ref | str,
    evaluated_champion: Ref | str = "",
    start_after: TaskRef | Sequence[TaskRef] = (),
    start_when: When | None = None,
    candidate_after: TaskRef | Sequence[TaskRef] = (),
    max_new_tokens: int = 0,
) -> TaskRef:
    """Add the rollout's tasks to the pipeline being built; returns `promote`.

    The fleet starts after `start_after` (if `start_when` holds), the candidate loads after `candidate_after`
    and once the champion is served; `model_version` and `evaluated_champion` are values or task outputs.
    """
    fleet = _fleet_args(cfg)
    rank: dict[str, Any] = {"max_lora_rank": cfg.serving.engine.max_lora_rank}
    prepared = task(
        prepare_fleet,
        base_model=base_model,
        model_cache_dir=cfg.storage.model_cache,
        pipeline=cfg.name,
        namespace=cfg.namespace,
        port=cfg.serving.port,
        resources=PREPARE_RESOURCES,
        after=start_after,
        when=start_when,
    )
    ready = [
        _apply("vllm", objects.vllm_deployment(cfg, "{{inputs.parameters.fleet}}", "{{inputs.parameters.model_dir}}"),
               {"fleet": prepared.fleet, "model_dir": prepared.model_dir}, prepared),
        _apply("vllm-service", objects.vllm_service(cfg, "{{inputs.parameters.fleet}}"), {"fleet": prepared.fleet},
               prepared, ready=False),
        _apply("vllm-pdb", objects.disruption_budget(cfg, "{{inputs.parameters.fleet}}", "vllm", cfg.serving.replicas),
               {"fleet": prepared.fleet}, prepared, ready=False),
    ]  # fmt: skip
    previous = prepared
    config_map, proxy, proxy_service, proxy_pdb = objects.proxy_objects(cfg)
    for name, manifest, wait in [
        ("proxy-config", config_map, False),  # the config before the proxy that mounts it
        ("proxy", proxy, True),
        ("proxy-service", proxy_service, False),
        ("proxy-pdb", proxy_pdb, False),
    ]:
        previous = _apply(name, manifest, {}, previous, ready=wait)
        ready.append(previous)
    # NetworkPolicies (no parameters: they select by the pipeline's labels), with the Deployments they guard.
    for name, manifest in zip(("vllm-policy", "proxy-policy"), objects.network_policies(cfg), strict=True):
        ready.append(_apply(name, manifest, {}, prepared, ready=False))
    wired: dict[str, Any] = {"vllm_url": prepared.vllm_url, "base_dir": prepared.model_dir}
    champion = _keyed(cfg, task(serve_champion, **fleet, **rank, **wired, after=ready))
    after = [candidate_after] if isinstance(candidate_after, TaskRef) else list(candidate_after)
    candidate = _keyed(
        cfg,
        task(
            load_candidate,
            **fleet,
            **rank,
            **wired,
            model_version=model_version,
            evaluated_champion=evaluated_champion,
            base_model=base_model,
            workflow_name=Pipeline.current().workflow_name,
            after=[*after, champion],
        ),
    )
    previous = candidate
    for percent in cfg.canary.weights:  # shift-10 -> analyze-10 -> shift-50 -> ...
        shifted = _keyed(
            cfg,
            task(
                shift_traffic,
                **fleet,
                vllm_url=prepared.vllm_url,
                percent=percent,
                task_name=f"shift-{canary.step_label(percent)}",
                after=previous,
            ),
        )
        previous = _keyed(
            cfg,
            task(
                canary,
                cfg.canary,
                **fleet,
                vllm_url=prepared.vllm_url,
                percent=percent,
                report_dir=Pipeline.current().run_dir / "reports",
                max_new_tokens=max_new_tokens or ANSWER_TOKENS,
                task_name=f"analyze-{canary.step_label(percent)}",
                resources=ANALYSIS_RESOURCES,
                # Never retried: an analysis is a measurement, and measuring until it passes would defeat the gate.
                retry_strategy=retry(0),
                after=shifted,
            ),
        )
    return _keyed(
        cfg,
        task(promote, **fleet, vllm_url=prepared.vllm_url, drain_timeout_s=cfg.canary.drain_timeout_s, after=previous),
    )


def finish_rollout(cfg: ServingConfig) -> TaskRef:
    """The exit handler's task (inside `with p.on_exit():`): roll back whatever did not reach promote.

    The exit handler cannot read task outputs: the fleet's address comes from the state file.
    """
    p = Pipeline.current()
    return _keyed(cfg, task(finish_step, **_fleet_args(cfg), workflow_status=p.workflow_status))


def gitops_objects(cfg: ServingConfig) -> list[dict[str, Any]]:
    """The serving objects for the configured base model, for `make templates` (workflow-templates/serving.yaml)."""
    fleet = fleet_name(cfg.name, cfg.base_model)
    model_dir = str(model_folder(cfg.base_model, Path(cfg.storage.model_cache)))
    return [*objects.network_policies(cfg), *objects.fleet_objects(cfg, fleet, model_dir), *objects.proxy_objects(cfg)]


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
