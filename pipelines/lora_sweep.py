"""LoRA sweep: train a grid of candidates in parallel, evaluate each, register only the best that passed the gate.

    python pipelines/lora_sweep.py run                                      # ranks 8 and 16 at the flagship's LR
    python pipelines/lora_sweep.py run --set 'sweep.ranks=[4,8,16]' --set 'sweep.learning_rates=[0.0005,0.001]'

Each grid point (LoRA rank x learning rate) is one iteration of a fan-out (Argo withItems): its own training run in
its own folder, then its own evaluation against the thresholds (and the champion). `select-best` ranks those that
passed by `evaluate.champion_metric`; the winner is registered (alias `challenger`), and nothing is when none
passed. The other sections are the flagship's (pipelines/llama_lora.py). The exit handler writes the run's report
(eksflow.llm.steps.report) and ends its MLflow runs, whatever the outcome. The grid's largest rank must fit the default
serving engine's max_lora_rank: the winner is served by the fleet of the model it is registered into.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, field_validator, model_validator

from eksflow import ClusterSettings, Item, Location, Pipeline, Ref, Settings, distributed, main, name_field, task
from eksflow.llm import BIG, LlmPipelineConfig, MlflowSettings, base_model_field, lineage, run_report
from eksflow.llm.serving.objects import ServingSettings
from eksflow.llm.serving.servable import refuse_unservable_ranks
from eksflow.llm.steps import (
    champion,
    evaluate,
    register,
    select_best,
    stage_data,
    train,
    train_neuron,
    validate_data,
)
from eksflow.llm.steps.evaluate import EvaluateSettings
from eksflow.llm.steps.stage_data import StageSettings
from eksflow.llm.steps.train import TrainSettings
from eksflow.llm.steps.validate_data import ValidateSettings


class SweepSettings(Settings):
    """The grid: every rank with every learning rate."""

    ranks: tuple[Annotated[int, Field(ge=1)], ...] = Field((8, 16), description="LoRA ranks (alpha = 2 x rank)")
    learning_rates: tuple[Annotated[float, Field(gt=0, allow_inf_nan=False)], ...] = Field(
        (1e-3,), description="peak learning rates"
    )
    parallelism: int = Field(1, ge=1, description="candidates trained at the same time")

    @field_validator("ranks", "learning_rates")
    @classmethod
    def _each_once(cls, values: tuple[float, ...]) -> tuple[float, ...]:
        if not values:
            raise ValueError("no value; give at least one")
        # Two equal grid points would train the same candidate twice, into the same folder.
        if repeated := sorted({v for v in values if values.count(v) > 1}):
            raise ValueError(f"{', '.join(f'{v:g}' for v in repeated)} given more than once; list each value once")
        return values


class LoraSweepConfig(LlmPipelineConfig):
    """The flagship's data, training and evaluation sections, plus the grid; it registers into the flagship's model."""

    name: str = name_field("lora-sweep")
    mlflow: MlflowSettings = MlflowSettings(model_name="llama-lora")  # the flagship's model: its challenger
    base_model: Location = base_model_field()
    cluster: ClusterSettings = ClusterSettings()
    data: StageSettings = StageSettings()
    validation: ValidateSettings = ValidateSettings()
    train: TrainSettings = TrainSettings()
    evaluate: EvaluateSettings = EvaluateSettings()
    sweep: SweepSettings = SweepSettings()

    @model_validator(mode="after")
    def _servable_ranks(self) -> LoraSweepConfig:
        # The winner is served where its registered model is (the flagship's fleet), by an engine this config does
        # not hold: the default engine's limit is the one a grid can be held to.
        limit = ServingSettings().engine.max_lora_rank
        refuse_unservable_ranks({"sweep.ranks": self.sweep.ranks}, limit, "the default serving engine's max_lora_rank")
        return self


def grid(cfg: LoraSweepConfig) -> list[dict[str, Any]]:
    """One item per candidate: a name, its LoRA shape and learning rate.

    The name is also the candidate's folder, so it spells the rate exactly (Python's shortest repr, distinct for
    distinct floats): `:g` gave 0.001 and 0.0010000001 one name, and the two candidates one folder.
    """
    return [
        {
            "name": f"r{rank}-lr{lr!r}",
            "lora": cfg.train.lora.model_copy(update={"rank": rank, "alpha": 2 * rank}).model_dump(mode="json"),
            "learning_rate": lr,
        }
        for rank in cfg.sweep.ranks
        for lr in cfg.sweep.learning_rates
    ]


def build(cfg: LoraSweepConfig) -> Pipeline:
    """The Argo Workflow of one sweep."""
    items = grid(cfg)
    with Pipeline(
        cfg,
        title=f"LoRA sweep of {cfg.base_model}: {len(items)} candidates",
        description="stage -> validate -> (train -> evaluate) x grid -> select best -> register",
        parameters={"data_source": cfg.data.source, "base_model": cfg.base_model},
    ) as p:
        tracking, model = cfg.tracking, cfg.model(p.parameters.base_model)

        incumbent = task(champion, tracking)  # the champion every candidate is judged against
        staged = task(stage_data, cfg.data, source=p.parameters.data_source, dest_dir=p.run_dir / "data")
        checked = task(
            validate_data,
            cfg.validation,
            model,
            cfg.train.template_settings,  # train.chat_template: token lengths as training renders the records
            dataset_dir=staged.dataset_dir,
            report_dir=p.run_dir / "reports",
            max_tokens=cfg.train.max_seq_len,
            method=cfg.train.method,
        )

        def candidate(item: Item) -> dict[str, Ref]:
            folder = p.run_dir / "candidates" / item.name
            trained = distributed(
                train,
                cfg.train,
                tracking,
                model,
                neuron_step=train_neuron,
                lora=item.lora,
                learning_rate=item.learning_rate,
                dataset_dir=staged.dataset_dir,
                output_dir=folder,
                run_name=p.workflow_name,
            )
            scored = task(
                evaluate,
                cfg.evaluate,
                tracking,
                model,
                cfg.train.template_settings,  # asked as it was trained
                dataset_dir=staged.dataset_dir,
                adapter_dir=trained.adapter_dir,
                mlflow_run_id=trained.mlflow_run_id,
                report_dir=folder,
                method=cfg.train.method,
                dpo_beta=cfg.train.dpo.beta,
                champion_version=incumbent.version,
                resources=BIG,
            )
            return {
                "passed": scored.passed,
                "metrics": scored.metrics,
                "report": scored.report,
                "adapter_dir": trained.adapter_dir,
                "mlflow_run_id": trained.mlflow_run_id,
            }

        candidates = p.fan_out(candidate, items, after=checked, parallelism=cfg.sweep.parallelism)
        chosen = task(
            select_best,
            names=[item["name"] for item in items],
            passed=candidates.passed,
            metrics=candidates.metrics,
            reports=candidates.report,
            adapter_dirs=candidates.adapter_dir,
            mlflow_run_ids=candidates.mlflow_run_id,
            metric=cfg.evaluate.champion_metric,
        )
        task(
            register,
            tracking,
            model,
            lineage(p, cfg, p.parameters.data_source),
            adapter_dir=chosen.adapter_dir,
            metrics=chosen.metrics,
            eval_report=chosen.report,
            dataset_digest=staged.dataset_digest,
            mlflow_run_id=chosen.mlflow_run_id,
            lora_quantize=cfg.train.lora.quantize,
            merged_dir=p.run_dir / "merged",
            resources=BIG,
            when=chosen.found,
        )
        with p.on_exit():  # whatever the outcome: the run's HTML page, and its MLflow runs ended
            run_report(p, cfg)
    return p


if __name__ == "__main__":
    main(build)
