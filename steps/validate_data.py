"""Check a staged dataset with great-expectations before any GPU time is spent on it.

    python -m steps.validate_data --dataset-dir=/fsx/<workflow>/data --report-dir=/fsx/<workflow>/reports

Each split (train.jsonl, eval.jsonl) must: have at least `min_rows` rows (mandatory: per-row expectations pass
vacuously on an empty file); parse line by line as JSON objects (malformed JSON and non-UTF-8 bytes are counted
and reported with their line numbers, never raised); have `prompt` and `completion` present, strings, not blank
and at most `max_*_chars` long. No eval prompt may occur in train. `mostly` applies to every per-row expectation:
mostly=0.99 lets 1 bad row in 100 pass. On failure the step prints each failed expectation with up to three
examples, writes the report, and exits 2 (bad data: never retried).

Outputs (one file each under --outputs-dir):
    train_rows  non-blank lines of train.jsonl
    eval_rows   non-blank lines of eval.jsonl
    report      path of validation.json (written on failure too)
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from steps.common.args import Settings, StepArgs, StepInputError, run_step
from steps.common.data import FIELDS, SPLITS, read_lines
from steps.common.outputs import atomic_write_text

if TYPE_CHECKING:
    import pandas as pd
    from great_expectations.core import ExpectationSuite, ExpectationValidationResult
    from great_expectations.expectations.expectation_configuration import ExpectationConfiguration

REPORT_FILE = "validation.json"
LINE = "line"  # column holding the 1-based line number: the index GE reports unexpected rows by
PARSE_ERROR = "parse_error"  # column holding why a line is not a JSON object, None when it is
EXAMPLES = 3
EXAMPLE_CHARS = 80


class ValidateSettings(Settings):
    """Data-quality thresholds (the `validate` section of the pipeline config)."""

    min_rows: int = Field(1, ge=1, description="fewest rows each split may have")
    max_prompt_chars: int = Field(4000, ge=1, description="longest prompt allowed, in characters")
    max_completion_chars: int = Field(4000, ge=1, description="longest completion allowed, in characters")
    mostly: float = Field(
        1.0, ge=0.0, le=1.0, description="fraction of rows each per-row expectation must hold for (1.0: all)"
    )


class Args(ValidateSettings, StepArgs):
    """Settings plus the folders the workflow wires in."""

    dataset_dir: Path = Field(description="staged dataset folder (stage_data's dataset_dir)")
    report_dir: Path = Field(description=f"folder to write {REPORT_FILE} in")


class Outputs(BaseModel):
    """Argo output parameters of validate_data."""

    train_rows: int
    eval_rows: int
    report: str


@dataclass(frozen=True)
class CheckResult:
    """The outcome of one expectation on one split."""

    split: str
    check: str  # stable short name, e.g. "completion_not_blank"
    expectation: str  # the great-expectations expectation type
    success: bool
    unexpected_count: int | None = None
    checked_count: int | None = None  # rows the expectation looked at (the `mostly` denominator)
    examples: tuple[str, ...] = ()
    detail: str = ""


@dataclass(frozen=True)
class Report:
    """What validation.json holds."""

    dataset_dir: str
    settings: dict[str, Any]
    rows: dict[str, int]
    overlap: int  # eval rows whose prompt occurs in train
    checks: list[CheckResult] = field(default_factory=list)

    @property
    def success(self) -> bool:
        """True when every expectation held."""
        return all(c.success for c in self.checks)

    @property
    def failures(self) -> list[CheckResult]:
        """The expectations that did not hold, in suite order."""
        return [c for c in self.checks if not c.success]

    def to_json(self) -> str:
        """The report as indented JSON."""
        return json.dumps({"success": self.success, **asdict(self)}, indent=1) + "\n"


def read_split(path: Path) -> pd.DataFrame:
    """One row per non-blank line: line number, parse error, the fields present and their `<field>_type` names."""
    import pandas as pd

    lines = list(read_lines(path))
    records = [line.record or {} for line in lines]
    frame = pd.DataFrame(
        {
            LINE: pd.Series([line.number for line in lines], dtype="int64"),
            PARSE_ERROR: pd.Series([line.error for line in lines], dtype=object),
        }
    )
    for name in FIELDS:
        if any(name in r for r in records):  # a field absent from every record stays absent: column_exists fails
            # object dtype keeps each value as JSON gave it, so the type check sees every row
            frame[name] = pd.Series([r.get(name) for r in records], dtype=object)
        frame[f"{name}_type"] = pd.Series([type(r.get(name)).__name__ for r in records], dtype=object)
    return frame


def build_suite(
    split: str, data: pd.DataFrame, settings: ValidateSettings, train_prompts: list[str] | None
) -> ExpectationSuite:
    """The expectations for one split; `train_prompts` adds the no-overlap expectation (for eval)."""
    import great_expectations as gx

    # great_expectations re-exports its expectations without __all__, which mypy --strict calls implicit
    from great_expectations.expectations import (  # type: ignore[attr-defined]
        ExpectColumnToExist,
        ExpectColumnValueLengthsToBeBetween,
        ExpectColumnValuesToBeNull,
        ExpectColumnValuesToBeOfType,
        ExpectColumnValuesToMatchRegex,
        ExpectColumnValuesToNotBeInSet,
        ExpectColumnValuesToNotBeNull,
        ExpectTableRowCountToBeBetween,
    )
    from great_expectations.expectations.row_conditions import Column

    mostly = settings.mostly
    suite = gx.ExpectationSuite(name=f"{split}_data")

    def add(check: str, expectation: Any) -> None:
        expectation.meta = {"check": check}
        suite.add_expectation(expectation)

    add("row_count", ExpectTableRowCountToBeBetween(min_value=settings.min_rows, max_value=None))
    add("lines_parse", ExpectColumnValuesToBeNull(column=PARSE_ERROR, mostly=mostly))
    limits = {"prompt": settings.max_prompt_chars, "completion": settings.max_completion_chars}
    for name in FIELDS:
        add(f"{name}_exists", ExpectColumnToExist(column=name))
        if name not in data.columns:
            continue  # the other expectations on it could only raise "column does not exist"
        # Unparsed lines are counted by lines_parse and non-strings by the type check; the row conditions keep
        # each bad row counted once, and keep lists and objects out of the string expectations.
        parsed = Column(PARSE_ERROR).is_null()
        text = Column(f"{name}_type") == "str"
        add(
            f"{name}_not_null",
            ExpectColumnValuesToNotBeNull(column=name, mostly=mostly, row_condition=parsed),
        )
        add(f"{name}_is_str", ExpectColumnValuesToBeOfType(column=name, type_="str", mostly=mostly))
        add(
            f"{name}_not_blank",
            ExpectColumnValuesToMatchRegex(column=name, regex=r"\S", mostly=mostly, row_condition=text),
        )
        add(
            f"{name}_max_chars",
            ExpectColumnValueLengthsToBeBetween(column=name, max_value=limits[name], mostly=mostly, row_condition=text),
        )
    if train_prompts and "prompt" in data.columns:
        add(
            "prompt_not_in_train",
            ExpectColumnValuesToNotBeInSet(
                column="prompt",
                value_set=train_prompts,
                mostly=mostly,
                row_condition=Column("prompt_type") == "str",
            ),
        )
    return suite


def validate(dataset_dir: Path, settings: ValidateSettings) -> Report:
    """Run the suites of both splits in one ephemeral great-expectations context."""
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    frames = {}
    for split, name in SPLITS.items():
        path = dataset_dir / name
        if not path.is_file():
            raise StepInputError(f"{str(path)!r} does not exist; is --dataset-dir the folder stage_data published?")
        frames[split] = read_split(path)

    train_prompts = _strings(frames["train"], "prompt")
    eval_prompts = _strings(frames["eval"], "prompt")
    train_set = set(train_prompts)
    overlap = sum(1 for p in eval_prompts if p in train_set)

    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    batches = context.data_sources.add_pandas("staged").add_dataframe_asset("split")
    whole = batches.add_batch_definition_whole_dataframe("whole")
    result_format = {
        "result_format": "SUMMARY",
        "unexpected_index_column_names": [LINE],
        "partial_unexpected_count": EXAMPLES,
    }
    checks: list[CheckResult] = []
    for split, data in frames.items():
        suite = build_suite(split, data, settings, sorted(train_set) if split == "eval" else None)
        order = [e.meta["check"] for e in suite.expectations if e.meta]
        outcome = whole.get_batch(batch_parameters={"dataframe": data}).validate(suite, result_format=result_format)
        results = sorted(outcome.results, key=lambda r: order.index(_config(r).meta["check"]))
        checks.extend(_check_result(split, r) for r in results)
    return Report(
        dataset_dir=str(dataset_dir),
        settings=settings.model_dump(),
        rows={split: len(data) for split, data in frames.items()},
        overlap=overlap,
        checks=checks,
    )


def format_failures(report: Report, report_path: Path) -> str:
    """A readable account of the failed expectations, for stderr."""
    failures = report.failures
    lines = [f"data validation failed for {report.dataset_dir}: {len(failures)} of {len(report.checks)} checks"]
    mostly = report.settings["mostly"]
    for c in failures:
        lines.append(f"  {c.split:<5} {c.check} ({c.expectation})")
        if c.unexpected_count is not None:
            share = c.unexpected_count / c.checked_count if c.checked_count else 0.0
            lines.append(
                f"        {c.unexpected_count} unexpected of {c.checked_count} ({share:.2%}; allowed {1 - mostly:.2%})"
            )
        if c.detail:
            lines.append(f"        {c.detail}")
        lines.extend(f"        {example}" for example in c.examples)
    lines.append(f"full report: {report_path}")
    return "\n".join(lines)


def run(args: Args) -> Outputs:
    """Validate `args.dataset_dir`; write the report; raise StepInputError when any expectation failed."""
    settings = ValidateSettings(**{name: getattr(args, name) for name in ValidateSettings.model_fields})
    report = validate(args.dataset_dir, settings)
    args.report_dir.mkdir(parents=True, exist_ok=True)
    report_path = (args.report_dir / REPORT_FILE).absolute()
    atomic_write_text(report_path, report.to_json())
    if not report.success:
        print(format_failures(report, report_path), file=sys.stderr)
        failed = ", ".join(sorted({f"{c.split}/{c.check}" for c in report.failures}))
        raise StepInputError(f"dataset {str(args.dataset_dir)!r} failed validation ({failed}); fix the data and rerun")
    print(
        f"validated {report.rows} rows of {args.dataset_dir}: all {len(report.checks)} checks passed", file=sys.stderr
    )
    return Outputs(train_rows=report.rows["train"], eval_rows=report.rows["eval"], report=str(report_path))


def _strings(data: pd.DataFrame, column: str) -> list[str]:
    if column not in data.columns:
        return []
    return [v for v in data[column] if isinstance(v, str)]


def _check_result(split: str, result: ExpectationValidationResult) -> CheckResult:
    config = _config(result)
    outcome = result.result or {}
    column = config.kwargs.get("column")
    unexpected = outcome.get("unexpected_count")
    checked = None
    if unexpected is not None:
        checked = int(outcome.get("element_count", 0)) - int(outcome.get("missing_count", 0))
    examples = tuple(
        f"line {int(item[LINE])}: {_show(item.get(column), raw=column == PARSE_ERROR)}"
        for item in outcome.get("partial_unexpected_index_list", [])[:EXAMPLES]
    )
    detail = _error(result.exception_info)
    if not detail and "observed_value" in outcome and not result.success:
        detail = f"observed: {outcome['observed_value']}"
    if not detail and config.type == "expect_column_to_exist" and not result.success:
        detail = f"no record has a {column!r} field (renamed?)"
    return CheckResult(
        split=split,
        check=str(config.meta["check"]),
        expectation=config.type,
        success=bool(result.success),
        unexpected_count=None if unexpected is None else int(unexpected),
        checked_count=checked,
        examples=examples,
        detail=detail,
    )


def _config(result: ExpectationValidationResult) -> ExpectationConfiguration:
    if result.expectation_config is None:
        raise RuntimeError(f"great-expectations returned a result without its expectation: {result}")
    return result.expectation_config


def _error(info: dict[str, Any] | None) -> str:
    """The exception message GE caught, if any; its shape differs between expectation and metric errors."""
    if not info:
        return ""
    found = [info] if "raised_exception" in info else [v for v in info.values() if isinstance(v, dict)]
    messages = [str(i.get("exception_message")) for i in found if i.get("raised_exception")]
    return "error: " + "; ".join(messages) if messages else ""


def _show(value: Any, *, raw: bool) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        text = "missing"
    else:
        text = str(value) if raw else repr(value)
    return text if len(text) <= EXAMPLE_CHARS else text[: EXAMPLE_CHARS - 1] + "…"


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m steps.validate_data`."""
    return run_step(Args, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
