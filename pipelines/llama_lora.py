"""Llama LoRA fine-tune: stage -> validate -> train -> evaluate -> register -> roll out on vLLM (gated on the eval).

Training runs unless `retrain` is if-data-changed (what the CronWorkflow passes) and the staged data has the digest
the champion was trained on; a skipped train skips everything after it. Evaluate judges the model against the
champion the run started with (a tie is no win). The rollout (eksflow/llm/serving/rollout.py) starts the serving
fleet as soon as the data is staged, then canaries the registered version through LiteLLM's weighted routing and
promotes it. The exit handler rolls back whatever did not reach promote, then writes the run's report
(eksflow.llm.steps.report: one HTML page) and ends its MLflow runs, whatever the outcome.

    python pipelines/llama_lora.py run                          # the whole pipeline here, no cluster
    python pipelines/llama_lora.py render > workflow.yaml       # the Argo Workflow `run` executes
    python pipelines/llama_lora.py run --config my.yaml --set train.max_steps=100
    python pipelines/llama_lora.py config --keys                # every setting, its default and what it does

Defaults fine-tune SmolLM2-135M-Instruct on the demo date-normalisation set in data/demo.
"""

from __future__ import annotations

from pydantic import Field

from eksflow import ClusterSettings, Pipeline, distributed, ended, main, name_field, task
from eksflow.llm import BIG, ServingConfig, finish_rollout, lineage, rollout, run_report
from eksflow.llm.steps import champion, evaluate, register, stage_data, train, train_neuron, validate_data
from eksflow.llm.steps.champion import Retrain
from eksflow.llm.steps.evaluate import EvaluateSettings
from eksflow.llm.steps.stage_data import StageSettings
from eksflow.llm.steps.train import TrainSettings
from eksflow.llm.steps.validate_data import ValidateSettings


class LlamaLoraConfig(ServingConfig):
    """The flagship's sections: each is the step's own Settings, so the pipeline and the step check the same rules.

    From ServingConfig: base_model, serving (the vLLM fleet and LiteLLM proxy) and canary (weights, analysis); from
    LlmPipelineConfig: mlflow and storage.model_cache (eksflow/llm/pipeline.py).
    """

    name: str = name_field("llama-lora")
    retrain: Retrain = Field(
        "always",
        description="always, or if-data-changed: skip training when the champion was trained on the same data "
        "(scheduled runs pass if-data-changed)",
    )
    cluster: ClusterSettings = ClusterSettings()
    data: StageSettings = StageSettings()
    validation: ValidateSettings = ValidateSettings()
    # 12 steps of 16 examples teach the demo's date format; 24 gain little for twice the training time
    # (bench/README.md, "make run on a fresh clone").
    train: TrainSettings = TrainSettings(max_steps=12)
    evaluate: EvaluateSettings = EvaluateSettings()


def build(cfg: LlamaLoraConfig) -> Pipeline:
    """The Argo Workflow for one fine-tuning run."""
    with Pipeline(
        cfg,
        title=f"LoRA fine-tune of {cfg.base_model}",
        description="stage -> validate -> train -> evaluate -> register -> canary on vLLM -> promote",
        parameters={"data_source": cfg.data.source, "base_model": cfg.base_model, "retrain": cfg.retrain},
        scheduled={"retrain": "if-data-changed"},  # a scheduled run trains only on new data
    ) as p:
        tracking, model = cfg.tracking, cfg.model(p.parameters.base_model)

        incumbent = task(champion, tracking, retrain=p.parameters.retrain)
        staged = task(
            stage_data,
            cfg.data,
            source=p.parameters.data_source,
            dest_dir=p.run_dir / "data",
            previous_digest=incumbent.dataset_digest,
            previous_version=incumbent.version,
        )
        new_data = staged.changed.otherwise(staged.reason)  # skipped, a task says why: "data unchanged since ..."
        checked = task(
            validate_data,
            cfg.validation,
            model,
            cfg.train.template_settings,  # train.chat_template: token lengths as training renders the records
            dataset_dir=staged.dataset_dir,
            report_dir=p.run_dir / "reports",
            max_tokens=cfg.train.max_seq_len,  # every example must fit the training sequence
            method=cfg.train.method,  # the record type the method trains on
            memoize=[staged.data_key],
        )
        # cpu: a container task; gpu: a KubeRay RayJob; trainium: a Volcano Job (cluster.instance_type picks)
        trained = distributed(
            train,
            cfg.train,
            tracking,
            model,
            neuron_step=train_neuron,
            dataset_dir=staged.dataset_dir,
            output_dir=p.run_dir / "train",
            run_name=p.workflow_name,
            after=checked,
            when=new_data,
            memoize=[staged.data_key],  # the same data, settings and code train the same adapter: reuse it
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
            report_dir=p.run_dir / "reports",
            method=cfg.train.method,  # dpo: held-out preference pairs, scored at the beta trained with
            dpo_beta=cfg.train.dpo.beta,
            champion_version=incumbent.version,  # judged against the champion this run started with
            resources=BIG,
            # an adapter reused from an earlier run was scored there, against the same champion
            memoize=[staged.data_key, trained, incumbent.version],
        )
        registered = task(
            register,
            tracking,
            model,
            lineage(p, cfg, p.parameters.data_source),
            adapter_dir=trained.adapter_dir,
            metrics=scored.metrics,
            eval_report=scored.report,
            dataset_digest=staged.dataset_digest,
            mlflow_run_id=trained.mlflow_run_id,
            lora_quantize=cfg.train.lora.quantize,
            resources=BIG,
            when=scored.passed,
        )
        rollout(  # vLLM fleet, LiteLLM proxy, canary steps, promote (eksflow/llm/serving/rollout.py)
            cfg,
            model_version=registered.model_version,
            evaluated_champion=scored.champion_version,
            base_model=p.parameters.base_model,
            start_after=staged,  # the engine loads while the model trains
            start_when=new_data,
            max_new_tokens=cfg.evaluate.max_new_tokens,
            chat_template=cfg.train.template_settings,  # the engine asks the model as training rendered its data
        )
        with p.on_exit():  # whatever the outcome: roll back what did not reach promote, then the run's HTML page
            run_report(p, cfg, after=ended(finish_rollout(cfg)))
    return p


if __name__ == "__main__":
    main(build)
