"""Score the fine-tuned adapter and the base model on the held-out split, then apply the gate.

    python -m steps.evaluate --dataset-dir=/fsx/run/data --adapter-dir=/fsx/run/train/checkpoints/step-40/adapter

Metrics (tuned, and the base model as `base_<name>` on the same examples): eval_loss and perplexity over the
completion tokens, exact_match and contains over batched greedy answers, and `<metric>_gain` = tuned - base.
The gate passes only if every threshold holds; a missing or NaN metric fails closed.

Champion/challenger: when model `--model-name` has a version with alias `champion` whose tag `eval_set_digest`
equals this run's (sha256 of eval.jsonl), the tuned `champion_metric` must also beat the champion's recorded score
(its tag `metric.<champion_metric>`) by `champion_margin` (higher is better; for eval_loss and perplexity lower
is better, so the challenger needs champion - margin or less). When the champion was scored on another eval set,
or has no recorded score for the metric, the scores are not comparable: the report says so and the thresholds
alone decide. A registry that cannot be reached fails the step (exit 1, retryable) rather than skip the check.
With --max-examples the digest gets suffix `@first-<N>`, so a subset score is never compared with a full-set one.

Outputs (one file each under --outputs-dir):
    passed          "true" / "false": register and deploy run only on "true"
    reason          one line: why the gate passed or which thresholds failed
    metrics         all metrics as a JSON object
    eval_set_digest "sha256:<hex of eval.jsonl>", with "@first-<N>" when --max-examples=N limits the scoring
    champion_version  the champion compared against; empty when none was comparable
    exact_match     tuned exact match on the held-out split, in [0, 1]
    base_exact_match  the base model's exact match on the same split
    report          path of the JSON report (metrics, thresholds, decision, sample answers)
    mlflow_run_url  the run's page in the MLflow UI (metrics, reports); empty without an http(s) address
"""

from __future__ import annotations

import json
import math
import operator
import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from eksflow.runtime.args import Settings, StepArgs, StepInputError, run_step
from steps.common import checkpoints, storage, tracking
from steps.common.base_model import default_cache_dir, resolve_model
from steps.common.data import EVAL_FILE, Example, load_examples

TaskMetric = Literal["exact_match", "contains"]
COMPARISONS: dict[str, Callable[[float, float], bool]] = {
    ">=": operator.ge,
    ">": operator.gt,
    "<=": operator.le,
    "<": operator.lt,
}
LOSS_METRICS = ("eval_loss", "perplexity")  # lower is better
REPORT_FILE = "eval_report.json"
TABLE_FILE = "eval_report.md"
REPORT_ARTIFACT = "eval"  # artifact folder of the reports in the MLflow run
EVAL_SET_TAG = "eval_set_digest"  # on the run (this step) and on the model version (register)
METRIC_TAG_PREFIX = "metric."  # register records each metric as tag metric.<name> on the version


class Threshold(Settings):
    """One gate rule: `metric op value`, e.g. exact_match >= 0.6."""

    metric: str
    op: Literal[">=", ">", "<=", "<"] = ">="
    value: float

    def describe(self) -> str:
        """`exact_match >= 0.6`."""
        return f"{self.metric} {self.op} {self.value:g}"


class EvaluateSettings(Settings):
    """Evaluation and gate settings (config section `evaluate`)."""

    task_metrics: tuple[TaskMetric, ...] = Field(("exact_match", "contains"), min_length=1)
    thresholds: tuple[Threshold, ...] = Field(
        (Threshold(metric="exact_match", value=0.6), Threshold(metric="exact_match_gain", value=0.2)),
        description="every rule must hold for the gate to pass",
    )
    max_examples: int = Field(0, ge=0, description="score the first N held-out examples; 0 = all")
    batch_size: int = Field(16, ge=1)
    max_new_tokens: int = Field(16, ge=1, description="greedy answer length cap")
    champion_metric: str = Field("exact_match", description="tuned metric compared with the champion's score")
    champion_margin: float = Field(
        0.0, ge=0.0, description="how much the challenger must beat the champion by (0: no regression allowed)"
    )

    @model_validator(mode="after")
    def _thresholds_name_known_metrics(self) -> EvaluateSettings:
        known = metric_names(self.task_metrics)
        for rule in self.thresholds:
            if rule.metric not in known:
                raise ValueError(f"threshold on unknown metric {rule.metric!r}; known metrics: {', '.join(known)}")
        comparable = [*LOSS_METRICS, *self.task_metrics]
        if self.champion_metric not in comparable:
            raise ValueError(
                f"champion_metric {self.champion_metric!r} is not a tuned metric; choose one of {', '.join(comparable)}"
            )
        return self


class Args(EvaluateSettings, StepArgs):
    """Evaluate step arguments."""

    dataset_dir: Path = Field(description="staged dataset folder holding eval.jsonl")
    adapter_dir: Path = Field(description="LoRA adapter folder written by the train step")
    base_model: str
    model_cache_dir: Path = Field(default_factory=default_cache_dir)
    report_dir: Path = Field(description="where the JSON and markdown reports are written")
    tracking_uri: str = Field("", description="MLflow URI for the run's metrics and the champion; empty: neither")
    mlflow_run_id: str = ""
    mlflow_ui_url: str = Field("", description="MLflow UI address for the run link; empty: the http(s) tracking URI")
    model_name: str = Field(
        "llama-lora",
        pattern=r"^$|" + tracking.MODEL_NAME_PATTERN,
        description="registered model whose champion the tuned model is compared with; empty skips the comparison",
    )


class Outputs(BaseModel):
    """Evaluate step outputs."""

    passed: bool
    reason: str
    metrics: dict[str, float]
    exact_match: float
    base_exact_match: float
    report: str
    eval_set_digest: str
    champion_version: str
    mlflow_run_url: str


class Champion(BaseModel):
    """What the registry recorded for the current champion version."""

    version: str
    eval_set_digest: str
    scores: dict[str, float]


class ChampionCheck(BaseModel):
    """The champion/challenger comparison: whether it applied, its inputs and its outcome."""

    applied: bool
    passed: bool
    reason: str
    version: str = ""
    metric: str = ""
    champion_score: float | None = None
    required: float | None = None
    actual: float | None = None


class Scores(BaseModel):
    """Metrics of one model on the held-out split, and its answers."""

    metrics: dict[str, float]
    answers: list[str]


def metric_names(task_metrics: Sequence[str]) -> list[str]:
    """Every metric a threshold may name."""
    names = [*LOSS_METRICS, *task_metrics]
    return [*names, *(f"base_{n}" for n in names), *(f"{n}_gain" for n in task_metrics)]


def task_score(metric: str, answer: str, reference: str) -> float:
    """1.0 if the answer is right under `metric`, else 0.0 (whitespace-trimmed, case-sensitive)."""
    if metric == "exact_match":
        return float(answer.strip() == reference.strip())
    if metric == "contains":
        return float(reference.strip() in answer)
    raise ValueError(f"unknown task metric {metric!r}")


def gate(metrics: Mapping[str, float], thresholds: Sequence[Threshold]) -> tuple[bool, str]:
    """Apply every threshold; missing and NaN metrics fail closed. Returns (passed, reason)."""
    failures = []
    for rule in thresholds:
        value = metrics.get(rule.metric)
        if value is None or math.isnan(value):
            failures.append(f"{rule.metric} is missing or NaN (needs {rule.describe()})")
        elif not COMPARISONS[rule.op](value, rule.value):
            failures.append(f"{rule.metric} = {value:.4f} fails {rule.describe()}")
    if not thresholds:
        return False, "no thresholds configured: refusing to pass an ungated model"
    if failures:
        return False, "; ".join(failures)
    return True, "all thresholds met: " + ", ".join(r.describe() for r in thresholds)


def champion_gate(
    metrics: Mapping[str, float], champion: Champion | None, eval_set_digest: str, metric: str, margin: float
) -> ChampionCheck:
    """Compare with the champion when it was scored on the same eval set; see the module docstring for the rule."""
    if champion is None:
        return ChampionCheck(applied=False, passed=True, reason="no champion yet: thresholds only")
    if champion.eval_set_digest != eval_set_digest:
        return ChampionCheck(
            applied=False,
            passed=True,
            version=champion.version,
            reason=(
                f"champion v{champion.version} was scored on eval set {champion.eval_set_digest[:12] or '(unknown)'}, "
                f"this run on {eval_set_digest[:12]}: not comparable, thresholds only"
            ),
        )
    recorded = champion.scores.get(metric)
    if recorded is None or math.isnan(recorded):
        return ChampionCheck(
            applied=False,
            passed=True,
            version=champion.version,
            reason=f"champion v{champion.version} has no recorded {metric}: not comparable, thresholds only",
        )
    lower_is_better = metric in LOSS_METRICS
    # Metrics are rounded to 6 digits (combine); so is the bar, or 0.7 + 0.05 would demand 0.7500000000000001.
    required = round(recorded - margin if lower_is_better else recorded + margin, 6)
    rule = Threshold(metric=metric, op="<=" if lower_is_better else ">=", value=required)
    ok, why = gate(metrics, [rule])
    actual = metrics.get(metric)
    return ChampionCheck(
        applied=True,
        passed=ok,
        version=champion.version,
        metric=metric,
        champion_score=recorded,
        required=required,
        actual=actual,
        reason=(
            f"{'beats' if ok else 'does not beat'} champion v{champion.version} ({metric} {recorded:.4f}, "
            f"margin {margin:g}): " + (rule.describe() if ok else why)
        ),
    )


def find_champion(tracking_uri: str, model_name: str) -> Champion | None:
    """The champion version's eval-set digest and recorded scores (tags register wrote), or None."""
    version = tracking.alias_version(tracking_uri, model_name, tracking.CHAMPION)
    if version is None:
        return None
    scores = {}
    for tag, value in version.tags.items():
        if tag.startswith(METRIC_TAG_PREFIX):
            try:
                scores[tag.removeprefix(METRIC_TAG_PREFIX)] = float(value)
            except ValueError:
                continue  # not a score this step recorded; it cannot be compared
    return Champion(version=str(version.version), eval_set_digest=version.tags.get(EVAL_SET_TAG, ""), scores=scores)


def eval_set_digest(path: Path, max_examples: int) -> str:
    """`sha256:<hex of the eval file>`, plus `@first-<N>` when only the first N examples are scored.

    A score on a subset is never compared with a score on the whole set.
    """
    digest = "sha256:" + storage.sha256_file(path)
    return f"{digest}@first-{max_examples}" if max_examples else digest


def run(args: Args) -> Outputs:
    """Verify the checkpoint, score base and tuned models, gate, write the reports and log to MLflow."""
    _verify_adapter(args.adapter_dir)
    examples = _eval_examples(args)
    digest = eval_set_digest(args.dataset_dir / EVAL_FILE, args.max_examples)
    # Looked up before the minutes of scoring, so an unreachable registry fails the step before spending them.
    champion = find_champion(args.tracking_uri, args.model_name) if args.tracking_uri and args.model_name else None
    scores = score_models(args, examples)
    metrics = combine(scores["tuned"].metrics, scores["base"].metrics, args.task_metrics)
    passed, reason = gate(metrics, args.thresholds)
    check = champion_gate(metrics, champion, digest, args.champion_metric, args.champion_margin)
    if passed and not check.passed:
        passed, reason = False, check.reason
    else:
        reason = f"{reason}; {check.reason}"
    report = _write_report(args, examples, scores, metrics, passed, reason, digest, check)
    if args.tracking_uri and args.mlflow_run_id:
        _log_to_run(args, metrics, passed, reason, digest, check, report)
    return Outputs(
        passed=passed,
        reason=reason,
        metrics=metrics,
        exact_match=metrics.get("exact_match", math.nan),
        base_exact_match=metrics.get("base_exact_match", math.nan),
        report=str(report),
        eval_set_digest=digest,
        champion_version=check.version if check.applied else "",
        mlflow_run_url=tracking.run_url(args.tracking_uri, args.mlflow_ui_url, args.mlflow_run_id),
    )


def _log_to_run(
    args: Args,
    metrics: Mapping[str, float],
    passed: bool,
    reason: str,
    digest: str,
    check: ChampionCheck,
    report: Path,
) -> None:
    """Log metrics as metrics; thresholds, champion rule and decision as tags, both reports as artifacts.

    Tags, not params: params are write-once, and a rerun with changed thresholds must still record what decided.
    """
    uri, run_id = args.tracking_uri, args.mlflow_run_id
    numbers = {**metrics, "gate_passed": float(passed)}
    if check.champion_score is not None:
        numbers["champion_" + check.metric] = check.champion_score
    tracking.log_metrics(uri, run_id, numbers)
    tracking.set_tags(
        uri,
        run_id,
        {
            EVAL_SET_TAG: digest,
            "gate.decision": "passed" if passed else "failed",
            "gate.reason": reason,
            "gate.thresholds": json.dumps([r.describe() for r in args.thresholds]),
            "gate.champion_rule": f"{args.champion_metric} margin {args.champion_margin:g}",
            "gate.champion_version": check.version,
            "gate.champion_applied": str(check.applied).lower(),
        },
    )
    tracking.log_files(uri, run_id, [report, report.with_name(TABLE_FILE)], REPORT_ARTIFACT)


def combine(tuned: Mapping[str, float], base: Mapping[str, float], task_metrics: Sequence[str]) -> dict[str, float]:
    """Tuned metrics, base metrics prefixed `base_`, and `<task metric>_gain`."""
    metrics = dict(tuned)
    metrics.update({f"base_{k}": v for k, v in base.items()})
    metrics.update({f"{m}_gain": tuned[m] - base[m] for m in task_metrics})
    return {k: round(v, 6) for k, v in metrics.items()}


def score_models(args: Args, examples: Sequence[Example]) -> dict[str, Scores]:
    """Scores of the base model and of base + adapter on `examples` (CPU or the first GPU)."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from steps.common.modeling import load_tokenizer

    torch.manual_seed(0)
    torch.set_num_threads(os.cpu_count() or 1)
    model_dir = resolve_model(args.base_model, args.model_cache_dir)
    tokenizer = load_tokenizer(model_dir)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model: Any = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model = model.to(device).eval()
    base = _score(model, tokenizer, examples, args)
    tuned_model = PeftModel.from_pretrained(model, args.adapter_dir).eval()
    return {"base": base, "tuned": _score(tuned_model, tokenizer, examples, args)}


def _score(model: Any, tokenizer: Any, examples: Sequence[Example], args: Args) -> Scores:
    from steps.common.modeling import generate

    loss = _completion_loss(model, tokenizer, examples, args)
    answers = generate(
        model, tokenizer, [e.prompt for e in examples], batch_size=args.batch_size, max_new_tokens=args.max_new_tokens
    )
    metrics = {"eval_loss": loss, "perplexity": math.exp(min(loss, 50.0))}
    for metric in args.task_metrics:
        scores = [task_score(metric, a, e.completion) for a, e in zip(answers, examples, strict=True)]
        metrics[metric] = sum(scores) / len(scores)
    return Scores(metrics=metrics, answers=answers)


def _completion_loss(model: Any, tokenizer: Any, examples: Sequence[Example], args: Args) -> float:
    """Mean cross-entropy per completion token (prompt tokens are not scored)."""
    import torch

    from steps.common.modeling import IGNORE_INDEX, collate, encode_example

    total, count = 0.0, 0
    encoded = [encode_example(tokenizer, e.prompt, e.completion, 4096) for e in examples]
    for start in range(0, len(encoded), args.batch_size):
        batch = {k: v.to(model.device) for k, v in collate(encoded[start : start + args.batch_size], 0).items()}
        with torch.no_grad():
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        labels = batch["labels"][:, 1:]
        losses = torch.nn.functional.cross_entropy(
            logits[:, :-1].flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE_INDEX, reduction="sum"
        )
        total += float(losses)
        count += int((labels != IGNORE_INDEX).sum())
    return total / max(count, 1)


def _eval_examples(args: Args) -> list[Example]:
    path = args.dataset_dir / EVAL_FILE
    if not path.is_file():
        raise StepInputError(f"{path} not found; did the stage step finish? (--dataset-dir={args.dataset_dir})")
    examples = load_examples(path)
    if args.max_examples:
        examples = examples[: args.max_examples]
    if not examples:
        raise StepInputError(f"{path} has no examples: nothing to evaluate")
    return examples


def _verify_adapter(adapter_dir: Path) -> None:
    """Refuse an adapter that is missing, or whose checkpoint fails its manifest check (RELIABILITY.md EV1).

    An adapter inside a committed checkpoint folder (`step-<N>`) must verify: a step folder without a manifest
    is a save that never finished. An adapter elsewhere (a hand-made one) has no manifest to check.
    """
    if not (adapter_dir / "adapter_config.json").is_file():
        raise StepInputError(
            f"no LoRA adapter at {adapter_dir}; did the train step finish? (tasks.train.outputs.parameters.adapter_dir)"
        )
    in_checkpoint = re.fullmatch(r"step-\d+", adapter_dir.parent.name) is not None  # checkpoints.commit's naming
    if in_checkpoint or (adapter_dir.parent / checkpoints.MANIFEST).is_file():
        try:
            checkpoints.verify(adapter_dir.parent)
        except checkpoints.CorruptCheckpointError as err:
            raise StepInputError(f"checkpoint failed verification: {err}") from err


def _write_report(
    args: Args,
    examples: Sequence[Example],
    scores: Mapping[str, Scores],
    metrics: Mapping[str, float],
    passed: bool,
    reason: str,
    digest: str,
    check: ChampionCheck,
) -> Path:
    """Write eval_report.json and eval_report.md, and print the table."""
    args.report_dir.mkdir(parents=True, exist_ok=True)
    samples = [
        {"prompt": e.prompt, "reference": e.completion, "base": b, "tuned": t}
        for e, b, t in zip(examples[:8], scores["base"].answers, scores["tuned"].answers, strict=False)
    ]
    thresholds = [{**r.model_dump(), "actual": metrics.get(r.metric)} for r in args.thresholds]
    report = {
        "passed": passed,
        "reason": reason,
        "metrics": dict(metrics),
        "thresholds": thresholds,
        "champion": {**check.model_dump(), "rule_metric": args.champion_metric, "margin": args.champion_margin},
        "eval_set_digest": digest,
        "examples": len(examples),
        "adapter_dir": str(args.adapter_dir),
        "samples": samples,
    }
    path = args.report_dir / REPORT_FILE
    path.write_text(json.dumps(report, indent=2), encoding="utf-8")
    table = render_table(metrics, args.task_metrics, args.thresholds, passed, reason, len(examples), check)
    (args.report_dir / TABLE_FILE).write_text(table + "\n", encoding="utf-8")
    print(table)
    return path


def render_table(
    metrics: Mapping[str, float],
    task_metrics: Sequence[str],
    thresholds: Sequence[Threshold],
    passed: bool,
    reason: str,
    n_examples: int,
    check: ChampionCheck | None = None,
) -> str:
    """A markdown table of base vs tuned metrics, the thresholds, the champion comparison and the decision."""
    lines = [f"held-out examples: {n_examples}", "", "| metric | base | tuned | gain |", "|---|---|---|---|"]
    for name in [*LOSS_METRICS, *task_metrics]:
        base, tuned = metrics.get(f"base_{name}", math.nan), metrics.get(name, math.nan)
        lines.append(f"| {name} | {base:.4f} | {tuned:.4f} | {tuned - base:+.4f} |")
    lines += ["", "| threshold | actual | result |", "|---|---|---|"]
    for rule in thresholds:
        value = metrics.get(rule.metric, math.nan)
        ok = not math.isnan(value) and COMPARISONS[rule.op](value, rule.value)
        lines.append(f"| {rule.describe()} | {value:.4f} | {'pass' if ok else 'FAIL'} |")
    if check is not None and check.applied and check.required is not None:
        actual = math.nan if check.actual is None else check.actual
        op = "<=" if check.metric in LOSS_METRICS else ">="
        lines.append(
            f"| {check.metric} {op} {check.required:g} (champion v{check.version}) | {actual:.4f} | "
            f"{'pass' if check.passed else 'FAIL'} |"
        )
    elif check is not None:
        lines += ["", f"champion: {check.reason}"]
    lines += ["", f"gate: {'PASSED' if passed else 'FAILED'} ({reason})"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Entry point: `python -m steps.evaluate --name=value ...`."""
    return run_step(Args, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
