r"""Score the fine-tuned adapter and the base model on the held-out split, then apply the gate.

    python -m eksflow.llm.steps.evaluate --dataset-dir=/fsx/run/data \
        --adapter-dir=/fsx/run/train/checkpoints/step-40/adapter --champion-version=3

Metrics (tuned, and the base model as `base_<name>` on the same examples): eval_loss and perplexity over the
answer tokens (a pair's completion, a conversation's last assistant turn), the task metrics (`task_metrics`) over
batched greedy answers, each asked with the example's history through the chat template, and `<task metric>_gain` =
tuned - base. The base model's answers and loss are decoded once per model, eval rows and decoding settings, and
read from --model-cache-dir (base-scores/) by every later evaluation: a sweep's candidates and retrains on the same
rows pay for the tuned model only (eksflow.llm.steps.evaluate.base_scores).
The gate passes only if every threshold holds; a missing or NaN metric fails closed. A threshold and champion_metric
name a custom task metric by its function's name (`starts_alike`, when no other task metric has it) or in full
(`steps.my_metrics:starts_alike`); validation turns either into the full name, the key of the metrics and reports.

Champion/challenger: --champion-version names this run's champion (the champion step reads alias `champion` once,
at the run's start; empty when there is none). When that version's tag `eval_set_digest` equals this run's (sha256
of eval.jsonl), the tuned `champion_metric` must also beat the champion's recorded score (its tag
`metric.<champion_metric>`): strictly, and by at least `champion_margin` (higher is better; for eval_loss and
perplexity lower is better, so the challenger needs less than the champion, and champion - margin or less). A tie is
not a win. When the champion was scored on another eval set, or has no recorded score for the metric, the scores are
not comparable: the report says so and the thresholds alone decide. The champion is an input like the data: a
pipeline that memoizes this step lists the champion's version in the memo key, so an evaluation reused from an
earlier run was judged against the same champion. A registry that cannot be reached fails the step (exit 1,
retryable) rather than skip the check.
With --method=dpo (train's method) the held-out split holds preference pairs: evaluate adds preference_accuracy and
reward_margin (implicit rewards at --dpo-beta; the base model's own log-likelihood ranking as their base_ forms, and
their _gain; eksflow.llm.steps.evaluate.preference), usable in thresholds and as champion_metric, and scores the
generation metrics and eval_loss against each pair's chosen answer.
With --max-examples the digest gets suffix `@first-<N>`, so a subset score is never compared with a full-set one;
with --sample-size (a seeded sample, eksflow.llm.steps.evaluate.sampling) the suffix `@sample-<N>-seed-<S>`, and the
report and the `intervals` output give each task metric's Wilson confidence interval at --confidence.

Outputs (one file each under --outputs-dir):
    passed          "true" / "false": register and deploy run only on "true"
    reason          one line: why the gate passed or which thresholds failed
    metrics         all metrics as a JSON object
    eval_set_digest "sha256:<hex of eval.jsonl>", with "@first-<N>" when --max-examples=N limits the scoring,
                    "@sample-<N>-seed-<S>" when a sample of N examples is scored
    intervals       confidence intervals of the task metrics as JSON {"exact_match": [low, high], ...} when a
                    sample was scored; {} when every example was
    champion_version  the champion the tuned model was judged against (--champion-version), empty when none: the
                    rollout refuses to replace any other
    exact_match     tuned exact match on the held-out split, in [0, 1]
    base_exact_match  the base model's exact match on the same split
    report          path of the JSON report (metrics, thresholds, decision, sample answers, per-row scores)
    mlflow_run_url  the run's page in the MLflow UI (metrics, reports); empty without an http(s) address
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field, ValidationInfo, field_validator, model_validator

from eksflow.llm.steps.common import tracking
from eksflow.llm.steps.common.base_model import default_cache_dir
from eksflow.llm.steps.common.chat_template import TemplateSettings
from eksflow.llm.steps.common.data import Method
from eksflow.llm.steps.common.gate import Threshold
from eksflow.llm.steps.evaluate.gate import LOSS_METRICS, never_holds, threshold_metric
from eksflow.llm.steps.evaluate.metrics import configured, resolve, shown
from eksflow.llm.steps.evaluate.preference import PREFERENCE_METRICS
from eksflow.runtime.args import Location, Settings, StepArgs


class EvaluateSettings(Settings):
    """Evaluation and gate settings (config section `evaluate`)."""

    task_metrics: tuple[str, ...] = Field(
        ("exact_match", "contains", "rouge_l"),
        min_length=1,
        description="how answers are scored: exact_match, contains, json_match, rouge_l, or 'module:function' declared "
        "with @eksflow.runtime.task_metric",
    )
    thresholds: tuple[Threshold, ...] = Field(
        (Threshold(metric="exact_match", value=0.6), Threshold(metric="exact_match_gain", value=0.2)),
        validate_default=True,  # the default rules too must read metrics task_metrics gives
        description="every rule must hold for the gate to pass; a rule names eval_loss, perplexity or a task metric "
        "(yours by its function's name or module:function), preference_accuracy or reward_margin (train.method "
        "dpo), base_<metric> for the base model's score, or <metric>_gain for tuned - base",
    )
    max_examples: int = Field(0, ge=0, description="score the first N held-out examples; 0 = all")
    # ~1,000 examples put a 95% Wilson interval of an exact match near 0.5 at +-0.03, enough to gate on
    sample_size: int = Field(
        0, ge=0, description="score N held-out examples drawn by sample_seed, with confidence intervals; 0 = all"
    )
    sample_seed: int = Field(0, ge=0, description="which sample sample_size draws (the same seed, the same sample)")
    confidence: float = Field(0.95, gt=0.0, lt=1.0, description="level of the intervals reported for a sample")
    batch_size: int = Field(16, ge=1, description="eval prompts generated per batch")
    max_new_tokens: int = Field(
        0, ge=0, description="greedy answer length cap; 0: the longest reference in tokens plus a margin"
    )
    champion_metric: str = Field(
        "exact_match",
        validate_default=True,
        description="tuned metric compared with the champion's score: eval_loss, perplexity or a task metric",
    )
    champion_margin: float = Field(
        0.0,
        ge=0.0,
        allow_inf_nan=False,
        description="how much the challenger must beat the champion by (0: any improvement; a tie never wins)",
    )

    def require_method(self, method: str) -> None:
        """Refuse (ValueError) a threshold or champion_metric on a preference metric unless train's method is dpo.

        Only held-out preference pairs have them: under sft such a rule could never read its metric.
        """
        named = {rule.metric.removeprefix("base_").removesuffix("_gain") for rule in self.thresholds}
        named.add(self.champion_metric)
        if method != "dpo" and (found := sorted(named & set(PREFERENCE_METRICS))):
            raise ValueError(
                f"{', '.join(found)} scores held-out preference pairs, which only train.method=dpo evaluates "
                f"(train.method={method})"
            )

    @field_validator("task_metrics")
    @classmethod
    def _known_task_metrics(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        # Resolved here, so the pipeline (render, run, submit) and the step refuse the same names, before anything runs;
        # resolving imports only a module of this project's own packages (eksflow.runtime.metrics.project_module).
        for name in names:
            resolve(name)
        return names

    @model_validator(mode="after")
    def _one_way_to_subset(self) -> EvaluateSettings:
        if self.max_examples and self.sample_size:
            raise ValueError(
                f"max_examples={self.max_examples} and sample_size={self.sample_size} both limit the examples "
                "scored; set one of them to 0 (sample_size draws a seeded sample and reports its intervals)"
            )
        return self

    # A metric named after task_metrics (a short name included) becomes the key the evaluation's metrics have, here,
    # once: the gate, the reports, the registry's tags and the sweep's ranking all read that one key.
    @field_validator("thresholds")
    @classmethod
    def _known_metrics(cls, rules: tuple[Threshold, ...], info: ValidationInfo) -> tuple[Threshold, ...]:
        task_metrics = info.data.get("task_metrics")
        if task_metrics is None:  # refused itself, saying why
            return rules
        keys = [threshold_metric(rule.metric, task_metrics) for rule in rules]
        unmeetable = [
            why for rule, key in zip(rules, keys, strict=True) if (why := never_holds(rule, key, task_metrics))
        ]
        if unmeetable:  # a gate no model can pass would fail every run, and say only that the model fell short
            raise ValueError("; ".join(unmeetable))
        return tuple(rule.model_copy(update={"metric": key}) for rule, key in zip(rules, keys, strict=True))

    @field_validator("champion_metric")
    @classmethod
    def _a_tuned_metric(cls, name: str, info: ValidationInfo) -> str:
        task_metrics = info.data.get("task_metrics")
        if task_metrics is None or name in LOSS_METRICS or name in PREFERENCE_METRICS:
            return name
        if (metric := configured(name, task_metrics)) is None:
            tuned = ", ".join([*LOSS_METRICS, *shown(task_metrics), *PREFERENCE_METRICS])
            raise ValueError(f"champion_metric {name!r} is not a tuned metric; choose one of {tuned}")
        return metric


class Args(EvaluateSettings, TemplateSettings, StepArgs):
    """Evaluate step arguments (train's chat template among them: the tuned model is asked as it was trained)."""

    dataset_dir: Path = Field(description="staged dataset folder holding eval.jsonl")
    adapter_dir: Path = Field(description="LoRA adapter folder written by the train step")
    base_model: Location = Field(description="base model reference the adapter was trained on")
    model_cache_dir: Path = Field(default_factory=default_cache_dir, description="cache for resolved base models")
    report_dir: Path = Field(description="where the JSON and markdown reports are written")
    tracking_uri: Location = Field("", description="MLflow URI for the run's metrics and the champion; empty: neither")
    mlflow_run_id: str = Field("", description="the train step's MLflow run, to log the metrics to; empty: none")
    mlflow_ui_url: str = Field("", description="MLflow UI address for the run link; empty: the http(s) tracking URI")
    model_name: str = Field(
        "llama-lora", pattern=tracking.MODEL_NAME_PATTERN, description="registered model whose champion is compared"
    )
    method: Method = Field(
        "sft", description="train's method: dpo scores held-out preference pairs (preference_accuracy, reward_margin)"
    )
    dpo_beta: float = Field(0.1, gt=0.0, le=100.0, description="train's dpo.beta: the implicit reward's scale")
    champion_version: str = Field(
        pattern=r"^([1-9][0-9]*)?$",
        description="the version the tuned model is judged against: this run's champion, as the champion step read "
        "it (tasks.champion.outputs.parameters.version); empty: none, the thresholds alone decide",
    )

    @model_validator(mode="after")
    def _preference_metrics_need_dpo(self) -> Args:
        self.require_method(self.method)
        return self

    @model_validator(mode="after")
    def _champion_in_a_registry(self) -> Args:
        if self.champion_version and not self.tracking_uri:
            raise ValueError(
                f"champion_version={self.champion_version} needs the registry that holds it: give tracking_uri"
            )
        return self


class Outputs(BaseModel):
    """Evaluate step outputs."""

    passed: bool
    reason: str
    metrics: dict[str, float]
    exact_match: float
    base_exact_match: float
    report: str
    eval_set_digest: str
    intervals: dict[str, list[float]]
    champion_version: str
    mlflow_run_url: str


# Prometheus gauges the controller emits from these outputs (eksflow_<task>_<output>, labelled by pipeline).
GAUGES = {"exact_match": "exact match of the tuned model on the eval set"}
