"""The evaluate step: verify the checkpoint, look up the champion, score base and tuned models, gate, report."""

from __future__ import annotations

import math
import re
from dataclasses import replace
from pathlib import Path

from eksflow.llm.steps.common import checkpoints, storage, tracking
from eksflow.llm.steps.common.data import EVAL_FILE, Example, load_examples
from eksflow.llm.steps.common.gate import gate
from eksflow.llm.steps.common.preference import Preference, load_preferences, usable_preferences
from eksflow.llm.steps.common.trained import model_kind
from eksflow.llm.steps.evaluate import Args, Outputs
from eksflow.llm.steps.evaluate.gate import Champion, champion_gate, combine
from eksflow.llm.steps.evaluate.report import EVAL_SET_TAG, log_to_run, write_report
from eksflow.llm.steps.evaluate.sampling import intervals, load_sample, sample_suffix
from eksflow.llm.steps.evaluate.scoring import score_models
from eksflow.runtime.args import StepInputError, run_step


def find_champion(tracking_uri: str, model_name: str, version: str) -> Champion | None:
    """What the registry recorded for this run's champion `version` (tags register wrote), or None when "" (none).

    StepInputError when the registry has no such version (deleted since the run's champion step read it).
    """
    from mlflow.exceptions import MlflowException

    if not version:
        return None
    with tracking.errors(tracking_uri, f"reading champion {model_name} version {version}"):
        try:
            found = tracking.client(tracking_uri).get_model_version(model_name, version)
        except MlflowException as err:
            if err.error_code not in tracking.NOT_FOUND_CODES:
                raise
            raise StepInputError(
                f"--champion-version={version}: {model_name!r} has no version {version} at {tracking_uri} (deleted "
                "since the champion step read it?); start a new run, which reads the champion again"
            ) from err
    tags = dict(found.tags or {})
    return Champion(version=version, eval_set_digest=tags.get(EVAL_SET_TAG, ""), scores=tracking.recorded_metrics(tags))


def eval_set_digest(path: Path, max_examples: int) -> str:
    """`sha256:<hex of the eval file>`, plus `@first-<N>` when only the first N examples are scored.

    A score on a subset is never compared with a score on the whole set.
    """
    digest = "sha256:" + storage.sha256_file(path)
    return f"{digest}@first-{max_examples}" if max_examples else digest


def run(args: Args) -> Outputs:
    """Verify the checkpoint, score base and tuned models, gate, write the reports and log to MLflow."""
    _verify_adapter(args.adapter_dir)
    pairs, total = _eval_records(args)
    # a preference pair is scored on its chosen answer too: generation metrics and eval_loss against `chosen`
    examples = [p.chosen if isinstance(p, Preference) else p for p in pairs]
    preferences = [p for p in pairs if isinstance(p, Preference)]
    digest = eval_set_digest(args.dataset_dir / EVAL_FILE, args.max_examples)
    digest += sample_suffix(args.sample_size, args.sample_seed, total)
    # Read before the minutes of scoring, so an unreachable registry fails the step before spending them.
    champion = find_champion(args.tracking_uri, args.model_name, args.champion_version)
    scores = score_models(args, examples, preferences)
    metrics = combine(scores["tuned"].metrics, scores["base"].metrics, args.task_metrics)
    verdict = gate(metrics, args.thresholds)
    check = champion_gate(metrics, champion, digest, args.champion_metric, args.champion_margin)
    if verdict.passed and not check.passed:
        verdict = replace(verdict, passed=False, reason=check.reason)
    else:
        verdict = replace(verdict, reason=f"{verdict.reason}; {check.reason}")
    answers = {name: s.answers for name, s in scores.items()}
    sampled = {}  # a confidence interval only for a random sample (--max-examples takes the first N: not one)
    if args.sample_size and len(examples) < total:
        sampled = intervals(args.task_metrics, answers, examples, args.confidence)
    report = write_report(args, examples, scores, metrics, verdict, digest, check, sampled, total)
    if args.tracking_uri and args.mlflow_run_id:
        log_to_run(args, metrics, verdict.passed, verdict.reason, digest, check, report)
    return Outputs(
        passed=verdict.passed,
        reason=verdict.reason,
        metrics=metrics,
        exact_match=metrics.get("exact_match", math.nan),
        base_exact_match=metrics.get("base_exact_match", math.nan),
        report=str(report),
        eval_set_digest=digest,
        intervals=sampled,
        champion_version=args.champion_version,
        mlflow_run_url=tracking.run_url(args.tracking_uri, args.mlflow_ui_url, args.mlflow_run_id),
    )


def _eval_records(args: Args) -> tuple[list[Example] | list[Preference], int]:
    """The examples (method dpo: preference pairs) to score and how many usable ones eval.jsonl holds."""
    path = args.dataset_dir / EVAL_FILE
    if not path.is_file():
        raise StepInputError(f"{path} not found; did the stage step finish? (--dataset-dir={args.dataset_dir})")
    dpo = args.method == "dpo"
    if args.sample_size:
        if dpo:
            return load_sample(path, args.sample_size, args.sample_seed, usable_preferences)
        return load_sample(path, args.sample_size, args.sample_seed)
    examples: list[Example] | list[Preference] = load_preferences(path) if dpo else load_examples(path)
    total = len(examples)
    if args.max_examples:
        examples = examples[: args.max_examples]
    if not examples:
        raise StepInputError(f"{path} has no examples: nothing to evaluate")
    return examples, total


def _verify_adapter(adapter_dir: Path) -> None:
    """Refuse an adapter (or model) that is missing, or whose checkpoint fails its manifest check (reliability EV1).

    An adapter inside a committed checkpoint folder (`step-<N>`) must verify: a step folder without a manifest
    is a save that never finished. An adapter elsewhere (a hand-made one) has no manifest to check.
    """
    model_kind(adapter_dir, "--adapter-dir")  # a LoRA adapter or a full fine-tune's model
    in_checkpoint = re.fullmatch(r"step-\d+", adapter_dir.parent.name) is not None  # checkpoints.commit's naming
    if in_checkpoint or (adapter_dir.parent / checkpoints.MANIFEST).is_file():
        try:
            checkpoints.verify(adapter_dir.parent)
        except checkpoints.CorruptCheckpointError as err:
            raise StepInputError(f"checkpoint failed verification: {err}") from err


def main(argv: list[str] | None = None) -> int:
    """Entry point: `python -m eksflow.llm.steps.evaluate --name=value ...`."""
    return run_step(Args, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
