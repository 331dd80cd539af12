"""Llama LoRA fine-tune: stage -> validate -> train -> evaluate -> register -> deploy (both gated on the eval).

Training runs unless `retrain` is if-data-changed (the CronWorkflow's setting) and the staged data has the digest
the champion was trained on; a skipped train skips everything after it.

    python pipelines/llama_lora.py run                          # the whole pipeline here, no cluster
    python pipelines/llama_lora.py render > workflow.yaml       # the Argo Workflow `run` executes
    python pipelines/llama_lora.py run --config my.yaml --set train.max_steps=100

Defaults fine-tune SmolLM2-135M-Instruct on the demo date-normalisation set in data/demo; every knob is in
eksflow/config.py.
"""

from __future__ import annotations

from hera.workflows import DAG, Resources, Workflow

from eksflow.config import PipelineConfig, config_hash
from eksflow.launchers import train_launcher
from eksflow.templates import gauges, pipeline_workflow, step_factory
from steps import champion, deploy, evaluate, register, stage_data, validate_data


def build(cfg: PipelineConfig) -> Workflow:
    """The Argo Workflow for one fine-tuning run."""
    step = step_factory(cfg)
    run_dir = f"{cfg.storage.fsx_mount}/runs/{{{{workflow.name}}}}"
    mlflow = {"tracking_uri": cfg.mlflow.tracking_uri}
    model = {"base_model": "{{workflow.parameters.base_model}}", "model_cache_dir": cfg.storage.model_cache}

    with pipeline_workflow(
        cfg,
        title=f"LoRA fine-tune of {cfg.base_model}",
        description="stage -> validate -> train -> evaluate -> register -> deploy",
        parameters={"data_source": cfg.data.source, "base_model": cfg.base_model, "retrain": cfg.retrain},
    ) as workflow:
        champion_t = step(
            champion, retrain="{{workflow.parameters.retrain}}", model_name=cfg.mlflow.model_name, **mlflow
        )
        stage_t = step(
            stage_data,
            cfg.data,
            wired=["previous_digest"],
            source="{{workflow.parameters.data_source}}",
            dest_dir=f"{run_dir}/data",
        )
        validate_t = step(
            validate_data,
            cfg.validation,
            wired=["dataset_dir"],
            **model,
            report_dir=f"{run_dir}/reports",
            max_tokens=cfg.train.max_seq_len,  # every example must fit the training sequence
        )
        # cpu: a container task; gpu: a KubeRay RayJob; trainium: a Volcano Job (cluster.instance_type picks).
        train_t = train_launcher(
            cfg,
            step,
            **model,
            **mlflow,
            dataset_dir=f"{run_dir}/data",
            output_dir=f"{run_dir}/train",
            run_name="{{workflow.name}}",
            experiment=cfg.mlflow.experiment,
        )
        evaluate_t = step(
            evaluate,
            cfg.evaluate,
            wired=["dataset_dir", "adapter_dir", "mlflow_run_id"],
            **model,
            **mlflow,
            report_dir=f"{run_dir}/reports",
            model_name=cfg.mlflow.model_name,
            mlflow_ui_url=cfg.mlflow.ui_url,
            resources=Resources(cpu_request=2, memory_request="8Gi"),
            metrics=gauges(cfg, eval_exact_match=("exact match on the eval set", "{{outputs.parameters.exact_match}}")),
        )
        register_t = step(
            register,
            wired=["adapter_dir", "metrics", "eval_report", "dataset_digest", "mlflow_run_id"],
            **model,
            **mlflow,
            model_name=cfg.mlflow.model_name,
            experiment=cfg.mlflow.experiment,
            workflow_name="{{workflow.name}}",
            workflow_uid="{{workflow.uid}}",
            dataset_uri="{{workflow.parameters.data_source}}",
            config_hash=config_hash(cfg),
            merged_dir=f"{run_dir}/merged",
            mlflow_ui_url=cfg.mlflow.ui_url,
            resources=Resources(cpu_request=2, memory_request="8Gi"),
        )
        deploy_t = step(
            deploy,
            cfg.deploy,
            wired=["model_version"],
            **mlflow,
            model_name=cfg.mlflow.model_name,
            serve_dir=f"{run_dir}/serve",
            resources=Resources(cpu_request=2, memory_request="8Gi"),
        )

        with DAG(name="main"):
            trained_on = champion_t()
            staged = stage_t(arguments={"previous_digest": trained_on.get_parameter("dataset_digest")})
            checked = validate_t(arguments={"dataset_dir": staged.get_parameter("dataset_dir")})
            trained = train_t(
                after=checked,
                arguments={"dataset_dir": staged.get_parameter("dataset_dir")},
                when=f"{staged.get_parameter('changed')} == true",
            )
            scored = evaluate_t(
                arguments={
                    "dataset_dir": staged.get_parameter("dataset_dir"),
                    "adapter_dir": trained.get_parameter("adapter_dir"),
                    "mlflow_run_id": trained.get_parameter("mlflow_run_id"),
                }
            )
            registered = register_t(
                arguments={
                    "adapter_dir": trained.get_parameter("adapter_dir"),
                    "metrics": scored.get_parameter("metrics"),
                    "eval_report": scored.get_parameter("report"),
                    "dataset_digest": staged.get_parameter("dataset_digest"),
                    "mlflow_run_id": trained.get_parameter("mlflow_run_id"),
                },
                when=f"{scored.get_parameter('passed')} == true",
            )
            deployed = deploy_t(arguments={"model_version": registered.get_parameter("model_version")})

            trained_on >> staged >> checked  # type: ignore[operator]  # Hera types >> as Task | list
            # .Succeeded, not plain `>>`: a skipped task counts as done for `>>`, and nothing after a skipped
            # training run (unchanged data) or a skipped registration (gate failed) may run.
            trained.on_success(scored)
            scored.on_success(registered)
            registered.on_success(deployed)
    return workflow


if __name__ == "__main__":
    from eksflow.cli import main

    main(build)
