"""The validate step: run the suite on both splits, write the report and Data Docs, exit 2 on bad data."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

from eksflow.runtime.args import StepInputError, run_step
from eksflow.runtime.outputs import atomic_write_text

if TYPE_CHECKING:
    pass
from eksflow.llm.steps.common.base_model import resolve_model
from eksflow.llm.steps.common.data import SPLITS
from eksflow.llm.steps.common.token_cache import default_cache_dir as default_token_cache
from eksflow.llm.steps.validate_data import DOCS_DIR, REPORT_FILE, Args, Outputs, ValidateSettings
from eksflow.llm.steps.validate_data.suite import Report, cached_token_lengths, validate


def format_failures(report: Report, report_path: Path) -> str:
    """A readable account of the failed expectations, for stderr."""
    failures = report.failures
    lines = [f"data validation failed for {report.dataset_dir}: {len(failures)} of {len(report.checks)} checks"]
    for c in failures:
        lines.append(f"  {c.split:<5} {c.check} ({c.expectation})")
        if c.unexpected_count is not None:
            share = c.unexpected_count / c.checked_count if c.checked_count else 0.0
            allowed = 1 - (c.mostly if c.mostly is not None else report.settings["mostly"])
            lines.append(
                f"        {c.unexpected_count} unexpected of {c.checked_count} ({share:.2%}; allowed {allowed:.2%})"
            )
        if c.detail:
            lines.append(f"        {c.detail}")
        lines.extend(f"        {example}" for example in c.examples)
    lines.append(f"full report: {report_path}")
    return "\n".join(lines)


def run(args: Args) -> Outputs:
    """Validate `args.dataset_dir`; write the report; raise StepInputError when any expectation failed."""
    settings = ValidateSettings(**{name: getattr(args, name) for name in ValidateSettings.model_fields})
    if bool(args.base_model) != bool(args.max_tokens):
        raise StepInputError(
            f"--base-model={args.base_model!r} and --max-tokens={args.max_tokens} go together: set both to check "
            "token lengths (the train step's base_model and max_seq_len), or neither to skip the check"
        )
    args.report_dir.mkdir(parents=True, exist_ok=True)
    report = validate(
        args.dataset_dir,
        settings,
        docs_dir=(args.report_dir / DOCS_DIR).absolute(),
        token_lengths=cached_token_lengths(
            args.templated(resolve_model(args.base_model, args.model_cache_dir), args.model_cache_dir),
            args.token_cache_dir or default_token_cache(args.model_cache_dir),
            args.method,
        )
        if args.base_model
        else None,
        max_tokens=args.max_tokens,
        method=args.method,
    )
    report_path = (args.report_dir / REPORT_FILE).absolute()
    atomic_write_text(report_path, report.to_json())
    for row in report.bad_rows:
        print(f"bad row: {row}", file=sys.stderr)
    for split, count in report.bad_count.items():
        listed = sum(1 for row in report.bad_rows if row.startswith(f"{SPLITS[split]}:"))
        if count > listed:
            print(f"bad rows: {count - listed} more in {SPLITS[split]} (counted by the checks)", file=sys.stderr)
    if not report.success:
        print(format_failures(report, report_path), file=sys.stderr)
        print(f"data docs: {args.report_dir.absolute() / DOCS_DIR / 'index.html'}", file=sys.stderr)
        failed = ", ".join(sorted({f"{c.split}/{c.check}" for c in report.failures}))
        raise StepInputError(f"dataset {str(args.dataset_dir)!r} failed validation ({failed}); fix the data and rerun")
    print(
        f"validated {report.rows} rows of {args.dataset_dir}: all {len(report.checks)} checks passed", file=sys.stderr
    )
    return Outputs(train_rows=report.rows["train"], eval_rows=report.rows["eval"], report=str(report_path))


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m eksflow.llm.steps.validate_data`."""
    return run_step(Args, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
