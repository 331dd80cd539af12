"""Llama LoRA fine-tune: stage -> validate -> train -> evaluate -> register -> deploy (both gated on the eval).

    python pipelines/llama_lora.py run                          # the whole pipeline here, no cluster
    python pipelines/llama_lora.py render > workflow.yaml       # the Argo Workflow `run` executes
    python pipelines/llama_lora.py run --config my.yaml --set train.max_steps=100

Defaults fine-tune SmolLM2-135M-Instruct on the demo date-normalisation set in data/demo; every knob is in
pipelines/core/config.py.
"""

from __future__ import annotations

from hera.workflows import DAG, Resources, Workflow

from pipelines.core.config import PipelineConfig
from pipelines.core.templates import pipeline_workflow, step_factory
from steps import deploy, evaluate, register, stage_data, train, validate_data


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
        parameters={"data_source": cfg.data.source, "base_model": cfg.base_model},
    ) as workflow:
        stage_t = step(stage_data, cfg.data, source="{{workflow.parameters.data_source}}", dest_dir=f"{run_dir}/data")
        validate_t = step(validate_data, cfg.validation, wired=["dataset_dir"], report_dir=f"{run_dir}/reports")
        train_t = step(
            train,
            cfg.train,
            wired=["dataset_dir"],
            **model,
            **mlflow,
            output_dir=f"{run_dir}/train",
            run_name="{{workflow.name}}",
            experiment=cfg.mlflow.experiment,
            image=cfg.images.train,
            resources=train_resources(cfg),
        )
        evaluate_t = step(
            evaluate,
            cfg.evaluate,
            wired=["dataset_dir", "adapter_dir", "mlflow_run_id"],
            **model,
            **mlflow,
            report_dir=f"{run_dir}/reports",
            resources=Resources(cpu_request=2, memory_request="8Gi"),
        )
        register_t = step(
            register,
            wired=["adapter_dir", "metrics", "dataset_digest", "mlflow_run_id"],
            **model,
            **mlflow,
            model_name=cfg.mlflow.model_name,
            experiment=cfg.mlflow.experiment,
            workflow_name="{{workflow.name}}",
            merged_dir=f"{run_dir}/merged",
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
            staged = stage_t()
            checked = validate_t(arguments={"dataset_dir": staged.get_parameter("dataset_dir")})
            trained = train_t(arguments={"dataset_dir": staged.get_parameter("dataset_dir")})
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
                    "dataset_digest": staged.get_parameter("dataset_digest"),
                    "mlflow_run_id": trained.get_parameter("mlflow_run_id"),
                },
                when=f"{scored.get_parameter('passed')} == true",
            )
            deployed = deploy_t(arguments={"model_version": registered.get_parameter("model_version")})

            staged >> checked >> trained >> scored >> registered  # type: ignore[operator]  # Hera types >> as Task | list
            registered.on_success(deployed)  # a skipped registration (gate failed) deploys nothing
    return workflow


def train_resources(cfg: PipelineConfig) -> Resources:
    """Requests for the training pod: one CPU per worker thread, or one GPU per worker."""
    workers = cfg.train.num_workers
    if cfg.train.use_gpu:
        return Resources(cpu_request=8 * workers, memory_request=f"{64 * workers}Gi", gpus=workers)
    return Resources(cpu_request=workers * cfg.train.cpus_per_worker, memory_request=f"{6 * workers}Gi")


if __name__ == "__main__":
    from pipelines.core.cli import main

    main(build)
