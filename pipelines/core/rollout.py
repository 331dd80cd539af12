"""The rollout as workflow tasks a user watches in the Argo UI (the last stage of a fine-tuning pipeline).

    prepare-fleet ─▶ vllm, vllm-service, vllm-pdb ─┐                  (starts as soon as the data is staged: the
    proxy-config ─▶ proxy, proxy-service, proxy-pdb ┴▶ serve-champion   engine loads while the model trains)
    register + serve-champion ─▶ load-candidate ─▶ shift-10 ─▶ analyze-10 ─▶ shift-50 ─▶ analyze-50 ─▶
        shift-100 ─▶ analyze-100 ─▶ promote
    onExit: finish-rollout      (rolls back whatever did not reach promote: failed analysis, killed server, stop)

The serving objects (pipelines/core/serving.py) are applied by Argo resource templates (action apply, no owner
reference: the fleet outlives the workflow; a Deployment's task succeeds once a pod is available, i.e. its
readiness probe generated). Rollout steps reach the fleet by its Service addresses; the keys come from the
serving Secret mounted as files. Canary weights come from `canary.weights`, one shift/analyze pair each.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from hera.workflows import DAG, Parameter, Resource, Resources, Task, Workflow
from hera.workflows import models as m

from pipelines.core import serving
from pipelines.core.config import PipelineConfig
from pipelines.core.templates import StepFactory, StepTemplate
from steps import canary, finish_rollout, load_candidate, prepare_fleet, promote, serve_champion, shift_traffic
from steps.common.base_model import model_folder
from steps.prepare_fleet import fleet_name

EXIT_HANDLER = "finish-rollout"
DEPLOYMENT_READY = "status.availableReplicas > 0"  # Argo waits for it: at least one pod passed its readiness probe
FLEET_INPUT = "{{inputs.parameters.fleet}}"
MODEL_DIR_INPUT = "{{inputs.parameters.model_dir}}"
STEP_RESOURCES = Resources(cpu_request=1, memory_request="2Gi", memory_limit="4Gi")


def percent_name(percent: float) -> str:
    """10.0 -> '10', 2.5 -> '2-5' (task names are kebab-case)."""
    return f"{percent:g}".replace(".", "-")


class Rollout:
    """The rollout's templates; `add` puts its tasks in the enclosing DAG."""

    def __init__(self, cfg: PipelineConfig, step: StepFactory, run_dir: str) -> None:
        self.cfg = cfg
        fleet = {
            "model_name": cfg.mlflow.model_name,
            "tracking_uri": cfg.mlflow.tracking_uri,
            "proxy_url": serving.proxy_url(cfg),
            "serving_dir": f"{cfg.storage.fsx_mount}/serving/{cfg.mlflow.model_name}/adapters",
            "state_file": f"{run_dir}/rollout/state.json",
            "secrets_dir": serving.SECRETS_DIR,  # in argv, so the local executor maps it to the run's volume
        }
        rank = {"max_lora_rank": cfg.serving.engine.max_lora_rank}
        self.prepare = step(
            prepare_fleet,
            wired=[],
            base_model="{{workflow.parameters.base_model}}",
            model_cache_dir=cfg.storage.model_cache,
            pipeline=cfg.name,
            namespace=cfg.namespace,
            port=cfg.serving.port,
            resources=Resources(cpu_request=1, memory_request="4Gi", memory_limit="8Gi"),
        )
        self.serve_champion = self._keyed(step(serve_champion, wired=["vllm_url", "base_dir"], **fleet, **rank))
        self.load_candidate = self._keyed(
            step(
                load_candidate,
                wired=["vllm_url", "base_dir", "model_version", "evaluated_champion"],
                **fleet,
                **rank,
                base_model="{{workflow.parameters.base_model}}",
                workflow_name="{{workflow.name}}",
            )
        )
        self.shift = self._keyed(step(shift_traffic, wired=["vllm_url", "percent"], **fleet))
        self.analyze = self._keyed(
            step(
                canary,
                cfg.canary,
                wired=["vllm_url", "percent"],
                **fleet,
                report_dir=f"{run_dir}/reports",
                max_new_tokens=cfg.evaluate.max_new_tokens,
                resources=STEP_RESOURCES,
            )
        )
        # Never retried: an analysis is a measurement, and measuring again until it passes would defeat the gate.
        self.analyze.container.retry_strategy = None
        self.promote = self._keyed(
            step(promote, wired=["vllm_url"], **fleet, drain_timeout_s=cfg.canary.drain_timeout_s)
        )
        # The exit handler cannot read task outputs: the fleet's address comes from the state file.
        self.finish = self._keyed(step(finish_rollout, **fleet, workflow_status="{{workflow.status}}"))
        self.fleet = [  # (template, its input parameters)
            (self._apply("vllm", serving.vllm_deployment(cfg, FLEET_INPUT, MODEL_DIR_INPUT), ["fleet", "model_dir"]),
             ["fleet", "model_dir"]),
            (self._apply("vllm-service", serving.vllm_service(cfg, FLEET_INPUT), ["fleet"], ready=False), ["fleet"]),
            (self._apply("vllm-pdb", serving.disruption_budget(cfg, FLEET_INPUT, "vllm", cfg.serving.replicas),
                         ["fleet"], ready=False), ["fleet"]),
        ]  # fmt: skip
        config_map, proxy, proxy_service, proxy_pdb = serving.proxy_objects(cfg)
        self.proxy = [
            self._apply("proxy-config", config_map, [], ready=False),
            self._apply("proxy", proxy, []),
            self._apply("proxy-service", proxy_service, [], ready=False),
            self._apply("proxy-pdb", proxy_pdb, [], ready=False),
        ]

    def _keyed(self, template: StepTemplate) -> StepTemplate:
        """Mount the serving Secret (keys as files at FleetArgs.secrets_dir), read-only."""
        secret = self.cfg.serving.secret
        container = template.container
        container.volumes = [m.Volume(name=secret, secret=m.SecretVolumeSource(secret_name=secret, default_mode=0o440))]
        container.volume_mounts = [
            *(container.volume_mounts or []),
            m.VolumeMount(name=secret, mount_path=serving.SECRETS_DIR, read_only=True),
        ]
        return template

    @staticmethod
    def _apply(name: str, manifest: dict[str, Any], inputs: Sequence[str], *, ready: bool = True) -> Resource:
        return Resource(
            name=name,
            action="apply",  # idempotent: a fleet already serving is left as it is
            manifest=yaml.safe_dump(manifest, sort_keys=False),
            success_condition=DEPLOYMENT_READY if ready else None,
            inputs=[Parameter(name=i) for i in inputs] or None,
        )

    def add(
        self,
        *,
        model_version: str | Parameter,
        evaluated_champion: str | Parameter = "",
        start_after: Task | None = None,
        start_when: str | None = None,
        candidate_after: Sequence[Task] = (),
    ) -> Task:
        """Add the rollout's tasks to the enclosing DAG; returns `promote`.

        The fleet starts after `start_after` (if `start_when` holds), the candidate loads after `candidate_after`;
        `model_version` and `evaluated_champion` are values or `{{tasks...}}` references.
        """
        prepared = self.prepare(when=start_when)
        if start_after is not None:
            start_after >> prepared  # type: ignore[operator]  # Hera types >> as Task | list
        fleet_args = {"fleet": prepared.get_parameter("fleet"), "model_dir": prepared.get_parameter("model_dir")}
        ready: list[Task] = []
        for template, names in self.fleet:
            task = template(arguments={n: fleet_args[n] for n in names})
            assert isinstance(task, Task)
            prepared.on_success(task)
            ready.append(task)
        previous = prepared
        for template in self.proxy:  # the config before the proxy that mounts it; all skipped with the fleet
            task = template()
            assert isinstance(task, Task)
            previous.on_success(task)
            previous = task
            ready.append(task)
        wired = {"vllm_url": prepared.get_parameter("vllm_url"), "base_dir": prepared.get_parameter("model_dir")}
        champion = self.serve_champion(arguments=wired)
        for task in ready:
            task.on_success(champion)
        candidate = self.load_candidate(
            arguments={**wired, "model_version": model_version, "evaluated_champion": evaluated_champion}
        )
        for task in [*candidate_after, champion]:
            task.on_success(candidate)
        previous = candidate
        for percent in self.cfg.canary.weights:
            arguments = {"vllm_url": wired["vllm_url"], "percent": f"{percent:g}"}
            # One template each, one task per canary step: shift-10 -> analyze-10 -> shift-50 -> ...
            shifted = self.shift.container(name=f"shift-{percent_name(percent)}", arguments=arguments)
            analysed = self.analyze.container(name=f"analyze-{percent_name(percent)}", arguments=arguments)
            assert isinstance(shifted, Task) and isinstance(analysed, Task)
            previous.on_success(shifted)
            shifted.on_success(analysed)
            previous = analysed
        promoted = self.promote(arguments={"vllm_url": wired["vllm_url"]})
        previous.on_success(promoted)
        return promoted

    def exit_handler(self, workflow: Workflow) -> None:
        """Run finish-rollout when the workflow ends, however it ends."""
        workflow.on_exit = EXIT_HANDLER


def rollout_workflow(cfg: PipelineConfig) -> Workflow:
    """Roll out an already registered version (workflow parameter `model_version`) on the fleet of `base_model`.

    The same tasks as the pipeline's last stage, without training: to retry a rollout, or to roll a version out
    on a fleet again. Its canary compares with the served champion; `evaluate`'s comparison is not re-checked.
    """
    from pipelines.core.templates import pipeline_workflow, step_factory

    with pipeline_workflow(
        cfg,
        title=f"roll out {cfg.mlflow.model_name}",
        description="fleet -> load candidate -> canary steps -> promote",
        parameters={"model_version": "", "base_model": cfg.base_model},
    ) as workflow:
        rollout = Rollout(cfg, step_factory(cfg), f"{cfg.storage.fsx_mount}/runs/{{{{workflow.name}}}}")
        rollout.exit_handler(workflow)
        with DAG(name="main"):
            rollout.add(model_version="{{workflow.parameters.model_version}}")
    return workflow


def gitops_objects(cfg: PipelineConfig) -> list[dict[str, Any]]:
    """The serving objects for the configured base model, for `make templates` (workflow-templates/serving.yaml)."""
    fleet = fleet_name(cfg.name, cfg.base_model)
    model_dir = str(model_folder(cfg.base_model, Path(cfg.storage.model_cache)))
    return [*serving.fleet_objects(cfg, fleet, model_dir), *serving.proxy_objects(cfg)]


def main(argv: Sequence[str] | None = None) -> None:
    """`python -m pipelines.core.rollout [-o FILE] [--set k=v ...]`: the serving objects as one YAML stream."""
    import argparse
    import sys

    from pipelines.core.config import ConfigError, load_config

    parser = argparse.ArgumentParser(prog="python -m pipelines.core.rollout", description=gitops_objects.__doc__)
    parser.add_argument("-o", "--output", type=Path, help="write here instead of stdout")
    parser.add_argument("--config", type=Path, help="YAML file overriding the defaults")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args(argv)
    try:
        cfg = load_config(args.config, args.overrides)
    except ConfigError as err:
        print(f"config error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    text = yaml.safe_dump_all(gitops_objects(cfg), sort_keys=False)
    if args.output is None:
        sys.stdout.write(text)
    else:
        args.output.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
