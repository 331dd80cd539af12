"""Champion check: re-evaluate the current champion on fresh data; record the result; fail loudly if it regressed.

    python pipelines/champion_check.py run --set data.source=s3://bucket/fresh-eval
    python pipelines/champion_check.py schedule --cron '0 6 * * *' | kubectl apply -f -     # every morning

The champion's adapter comes from the registry (alias `champion`), the data is staged and validated like the
flagship's, and `evaluate` scores the champion (and its base model) against the same thresholds a new model must
meet. `record-check` writes the outcome on the model version (tags check.*), and when it no longer meets them the
`alert` task fails the workflow with one line a notification can carry (also `record-check`'s `summary` output).
The exit handler writes the run's report (eksflow.llm.steps.report), whatever the outcome.
"""

from __future__ import annotations

from eksflow import Pipeline, main, name_field, retry, task
from eksflow.llm import BIG, LlmPipelineConfig, MlflowSettings, run_report
from eksflow.llm.steps import alert, evaluate, fetch_champion, record_check, stage_data, validate_data
from eksflow.llm.steps.evaluate import EvaluateSettings
from eksflow.llm.steps.stage_data import StageSettings
from eksflow.llm.steps.validate_data import ValidateSettings


class ChampionCheckConfig(LlmPipelineConfig):
    """Where the fresh data is, and the thresholds the champion must still meet (the flagship's by default)."""

    name: str = name_field("champion-check")
    mlflow: MlflowSettings = MlflowSettings(model_name="llama-lora")  # the flagship's model, whose champion it checks
    data: StageSettings = StageSettings()
    validation: ValidateSettings = ValidateSettings()
    evaluate: EvaluateSettings = EvaluateSettings()


def build(cfg: ChampionCheckConfig) -> Pipeline:
    """The Argo Workflow of one check."""
    with Pipeline(
        cfg,
        title=f"Champion check of {cfg.model_name}",
        description="fetch champion + stage -> validate -> evaluate -> record on the version -> alert if regressed",
        parameters={"data_source": cfg.data.source},
    ) as p:
        tracking = cfg.tracking
        champion = task(fetch_champion, tracking, dest_dir=p.run_dir / "champion")
        staged = task(stage_data, cfg.data, source=p.parameters.data_source, dest_dir=p.run_dir / "data")
        # the rows' format and quality; token lengths are a training concern (no sequence length to check here)
        checked = task(validate_data, cfg.validation, dataset_dir=staged.dataset_dir, report_dir=p.run_dir / "reports")
        scored = task(
            evaluate,
            cfg.evaluate,
            tracking,
            cfg.model(champion.base_model),
            dataset_dir=staged.dataset_dir,
            adapter_dir=champion.adapter_dir,
            report_dir=p.run_dir / "reports",
            champion_version="",  # the thresholds decide: the champion is not compared with itself
            after=checked,
            resources=BIG,
        )
        recorded = task(
            record_check,
            tracking,
            version=champion.version,
            passed=scored.passed,
            reason=scored.reason,
            metrics=scored.metrics,
            dataset_digest=staged.dataset_digest,
            eval_set_digest=scored.eval_set_digest,
            workflow_name=p.workflow_name,
        )
        task(alert, message=recorded.summary, when=recorded.regressed, retry_strategy=retry(0))
        with p.on_exit():  # whatever the outcome: the run's HTML page, and its MLflow runs ended
            run_report(p, cfg)
    return p


if __name__ == "__main__":
    main(build)
