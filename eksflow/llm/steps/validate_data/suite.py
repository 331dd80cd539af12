"""The great-expectations suite: the expectations, run on each split chunk by chunk, and their combined results.

Each split is read twice (eksflow.llm.steps.validate_data.scan): once for what needs the whole file (duplicates,
train/eval overlap, token counts, which fields occur), once as frames of at most `chunk_rows` rows that
great-expectations validates in turn; eksflow.llm.steps.validate_data.merge adds the per-chunk results up by GE's rules,
so the counts, `mostly` decisions and examples (the first in line order) are those of one validation of the whole split,
while memory stays that of one chunk. The row count is checked once, on a frame of the line numbers alone. Data Docs
show the combined result of each split.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from eksflow.llm.steps.common.data import FIELDS, SPLITS, Method
from eksflow.llm.steps.validate_data import ValidateSettings
from eksflow.llm.steps.validate_data.merge import merge
from eksflow.llm.steps.validate_data.scan import (
    DUPLICATE,
    EXPLAINED,
    LINE,
    OVERLAP,
    PARSE_ERROR,
    RECORD_ERROR,
    TOKENS,
    Scan,
    TokenCounter,
    TokenLengths,
    find_overlap,
    frames,
    scan,
)
from eksflow.runtime.args import StepInputError

if TYPE_CHECKING:
    from great_expectations.core import ExpectationSuite, ExpectationSuiteValidationResult, ExpectationValidationResult
    from great_expectations.data_context.data_context.abstract_data_context import AbstractDataContext
    from great_expectations.expectations.expectation_configuration import ExpectationConfiguration

EXAMPLES = 3


EXAMPLE_CHARS = 80


RESULT_FORMAT = {
    "result_format": "SUMMARY",
    "unexpected_index_column_names": [LINE],
    "partial_unexpected_count": EXAMPLES,
}


@dataclass(frozen=True)
class CheckResult:
    """The outcome of one expectation on one split."""

    split: str
    check: str  # stable short name, e.g. "completion_not_blank"
    expectation: str  # the great-expectations expectation type
    success: bool
    unexpected_count: int | None = None
    checked_count: int | None = None  # rows the expectation looked at (the `mostly` denominator)
    mostly: float | None = None  # the tolerance it ran with (per-row expectations only)
    examples: tuple[str, ...] = ()
    detail: str = ""


@dataclass(frozen=True)
class Report:
    """What validation.json holds."""

    dataset_dir: str
    settings: dict[str, Any]
    rows: dict[str, int]
    overlap: int  # eval rows whose prompt (of a conversation: history) occurs in train
    checks: list[CheckResult] = field(default_factory=list)
    bad_rows: list[str] = field(default_factory=list)  # "<file>:<line>: why", the first of each split's malformed rows
    bad_count: dict[str, int] = field(default_factory=dict)  # split -> rows unparsed or malformed, listed or not

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


def build_suite(
    split: str,
    columns: frozenset[str],
    settings: ValidateSettings,
    *,
    compare_with_train: bool = False,
    max_tokens: int = 0,
    part: str = "all",
) -> ExpectationSuite:
    """The expectations for one split whose frames have `columns`, in report order.

    `compare_with_train` adds the no-overlap expectation (eval); `part` selects "table" (the row count, run once
    on the whole split), "rows" (the rest, run on each chunk) or "all" (both: the suite Data Docs show). A file of
    pairs is checked field by field; a file of conversations row by row (RECORD_ERROR names what is wrong).
    """
    import great_expectations as gx

    # great_expectations re-exports its expectations without __all__, which mypy --strict calls implicit
    from great_expectations.expectations import (  # type: ignore[attr-defined]
        ExpectColumnToExist,
        ExpectColumnValueLengthsToBeBetween,
        ExpectColumnValuesToBeBetween,
        ExpectColumnValuesToBeNull,
        ExpectColumnValuesToBeOfType,
        ExpectColumnValuesToMatchRegex,
        ExpectColumnValuesToNotBeNull,
        ExpectTableRowCountToBeBetween,
    )
    from great_expectations.expectations.row_conditions import Column

    mostly = settings.mostly_of
    suite = gx.ExpectationSuite(name=f"{split}_data" if part == "all" else f"{split}_{part}")

    def add(check: str, expectation: Any) -> None:
        if part == "all" or (part == "table") == (check == "row_count"):
            expectation.meta = {"check": check}
            suite.add_expectation(expectation)

    add("row_count", ExpectTableRowCountToBeBetween(min_value=settings.min_rows, max_value=None))
    add("lines_parse", ExpectColumnValuesToBeNull(column=PARSE_ERROR, mostly=mostly("lines_parse")))
    limits = {"prompt": settings.max_prompt_chars, "completion": settings.max_completion_chars}
    conversational = RECORD_ERROR in columns
    for name in () if conversational else FIELDS:
        add(f"{name}_exists", ExpectColumnToExist(column=name))
        if name not in columns:
            continue  # the other expectations on it could only raise "column does not exist"
        # Unparsed lines are counted by lines_parse and non-strings by the type check; the row conditions keep
        # each bad row counted once, and keep lists and objects out of the string expectations.
        parsed = Column(PARSE_ERROR).is_null()
        text = Column(f"{name}_type") == "str"
        add(
            f"{name}_not_null",
            ExpectColumnValuesToNotBeNull(column=name, mostly=mostly(f"{name}_not_null"), row_condition=parsed),
        )
        add(f"{name}_is_str", ExpectColumnValuesToBeOfType(column=name, type_="str", mostly=mostly(f"{name}_is_str")))
        add(
            f"{name}_not_blank",
            ExpectColumnValuesToMatchRegex(
                column=name, regex=r"\S", mostly=mostly(f"{name}_not_blank"), row_condition=text
            ),
        )
        add(
            f"{name}_max_chars",
            ExpectColumnValueLengthsToBeBetween(
                column=name, max_value=limits[name], mostly=mostly(f"{name}_max_chars"), row_condition=text
            ),
        )
    usable = Column(PARSE_ERROR).is_null()
    add(
        "no_duplicate",
        ExpectColumnValuesToBeNull(column=DUPLICATE, mostly=mostly("no_duplicate"), row_condition=usable),
    )
    if conversational:
        add(
            "record_valid",
            ExpectColumnValuesToBeNull(column=RECORD_ERROR, mostly=mostly("record_valid"), row_condition=usable),
        )
    if TOKENS in columns and max_tokens:
        add(
            "max_tokens",
            ExpectColumnValuesToBeBetween(column=TOKENS, max_value=max_tokens, mostly=mostly("max_tokens")),
        )
    if compare_with_train and ("prompt" in columns or conversational):
        # A column of the matching train line, not the train prompts as a value set: a million-string value set
        # is copied into every access of the expectation's configuration and rendered into the Data Docs.
        add(
            "prompt_not_in_train",
            ExpectColumnValuesToBeNull(
                column=OVERLAP,
                mostly=mostly("prompt_not_in_train"),
                row_condition=usable if conversational else Column("prompt_type") == "str",
            ),
        )
    return suite


def columns_of(found: Scan) -> frozenset[str]:
    """The columns every frame of a split has (eksflow.llm.steps.validate_data.scan.frames)."""
    names = {LINE, PARSE_ERROR, DUPLICATE, *found.fields, *(f"{name}_type" for name in FIELDS)}
    names |= {RECORD_ERROR} if found.checked_whole else set()
    names |= {TOKENS} if found.tokens is not None else set()
    names |= {OVERLAP} if found.overlap is not None else set()
    return frozenset(names)


def validate(
    dataset_dir: Path,
    settings: ValidateSettings,
    *,
    docs_dir: Path | None = None,
    count_tokens: TokenCounter | None = None,
    token_lengths: TokenLengths | None = None,
    max_tokens: int = 0,
    method: Method = "sft",
) -> Report:
    """Run the suites of both splits, chunk by chunk, in one ephemeral great-expectations context.

    With `docs_dir`, Data Docs (index.html) of the combined results are written there. With `max_tokens` and a
    way to count tokens (`count_tokens` on prompt/completion pairs, or `token_lengths` of a split file, e.g. from
    the token cache), rows longer than max_tokens tokens fail the max_tokens check.
    """
    import great_expectations as gx
    import pandas as pd
    from great_expectations.data_context.types.base import ProgressBarsConfig

    scans: dict[str, Scan] = {}
    limits = {"prompt": settings.max_prompt_chars, "completion": settings.max_completion_chars}
    for split, name in SPLITS.items():
        path = dataset_dir / name
        if not path.is_file():
            raise StepInputError(f"{str(path)!r} does not exist; is --dataset-dir the folder stage_data published?")
        counting = bool(max_tokens)
        scans[split] = scan(
            path, limits, count_tokens if counting else None, token_lengths if counting else None, method
        )
    compare = len(scans["train"].prompt_keys) > 0  # as before: no overlap check when train has no string prompt
    overlap = find_overlap(scans["eval"], scans["train"])
    if not compare:
        scans["eval"].overlap = None

    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    if docs_dir is not None:
        context.add_data_docs_site(
            site_name="run",
            site_config={
                "class_name": "SiteBuilder",
                "store_backend": {"class_name": "TupleFilesystemStoreBackend", "base_directory": str(docs_dir)},
                "site_index_builder": {"class_name": "DefaultSiteIndexBuilder"},
            },
        )
    whole = (
        context.data_sources.add_pandas("staged")
        .add_dataframe_asset("split")
        .add_batch_definition_whole_dataframe("whole")
    )
    checks: list[CheckResult] = []
    for split, found in scans.items():
        options: dict[str, Any] = {
            "compare_with_train": split == "eval" and compare,
            "max_tokens": max_tokens,
        }
        columns = columns_of(found)
        table = whole.get_batch(batch_parameters={"dataframe": pd.DataFrame({LINE: found.lines})}).validate(
            build_suite(split, columns, settings, part="table", **options), result_format=RESULT_FORMAT
        )
        rows_suite = build_suite(split, columns, settings, part="rows", **options)
        parts: dict[str, list[ExpectationValidationResult]] = {}
        for frame in frames(found, settings.chunk_rows):
            outcome = whole.get_batch(batch_parameters={"dataframe": frame}).validate(
                rows_suite, result_format=RESULT_FORMAT
            )
            for result in outcome.results:
                parts.setdefault(str(_config(result).meta["check"]), []).append(result)
            del frame, outcome  # one chunk in memory at a time
        suite = build_suite(split, columns, settings, part="all", **options)
        order = [str(e.meta["check"]) for e in suite.expectations if e.meta]
        merged = {str(_config(r).meta["check"]): r for r in table.results}
        merged.update({check: merge(results, EXAMPLES) for check, results in parts.items()})
        results = [merged[check] for check in order]
        checks.extend(_check_result(split, r, settings) for r in results)
        if docs_dir is not None:
            _write_docs(context, suite, results, split)
    return Report(
        dataset_dir=str(dataset_dir),
        settings=settings.model_dump(),
        rows={split: found.rows for split, found in scans.items()},
        overlap=overlap,
        checks=checks,
        bad_rows=[row for found in scans.values() for row in found.bad_rows],
        bad_count={split: found.bad_count for split, found in scans.items()},
    )


def _write_docs(
    context: AbstractDataContext, suite: ExpectationSuite, results: list[ExpectationValidationResult], split: str
) -> None:
    """Store the combined result of one split and render its Data Docs pages (what a checkpoint action does)."""
    import datetime

    from great_expectations.core import ExpectationSuiteValidationResult
    from great_expectations.core.run_identifier import RunIdentifier
    from great_expectations.data_context.types.resource_identifiers import (
        ExpectationSuiteIdentifier,
        ValidationResultIdentifier,
    )

    suite = context.suites.add(suite)
    passed = sum(1 for r in results if r.success)
    combined: ExpectationSuiteValidationResult = ExpectationSuiteValidationResult(
        success=passed == len(results),
        results=results,
        suite_name=suite.name,
        statistics={
            "evaluated_expectations": len(results),
            "successful_expectations": passed,
            "unsuccessful_expectations": len(results) - passed,
            "success_percent": 100.0 * passed / len(results) if results else None,
        },
        meta={"active_batch_definition": {"data_asset_name": split}},
    )
    run_id = RunIdentifier(run_name=split, run_time=datetime.datetime.now(datetime.timezone.utc))
    combined.meta["run_id"] = run_id
    combined.meta["validation_time"] = run_id.run_time
    suite_id = ExpectationSuiteIdentifier(name=suite.name)
    result_id = ValidationResultIdentifier(expectation_suite_identifier=suite_id, run_id=run_id, batch_identifier=split)
    context.validation_results_store.set(result_id, combined)
    # both pages, as GE's UpdateDataDocsAction asks (its annotation allows one kind per list)
    context.build_data_docs(site_names=["run"], resource_identifiers=cast(Any, [result_id, suite_id]))


def cached_token_lengths(model_dir: Path, token_cache_dir: Path, method: Method = "sft") -> TokenLengths:
    """Token counts of a split's usable rows, by `model_dir`'s tokenizer, from its token cache (built if missing).

    Counted as training encodes an example (before truncation; a preference pair's longer answer), and the cache
    built here is the one the train step then finds: the data is tokenized once for both steps.
    """
    from eksflow.llm.steps.common import token_cache
    from eksflow.llm.steps.common.modeling import load_tokenizer

    tokenizer = load_tokenizer(model_dir)

    def lengths(path: Path) -> tuple[Any, Any]:
        cache, built = token_cache.ensure(path, tokenizer, token_cache_dir, preference=method == "dpo")
        print(f"token cache: {'built' if built else 'reused'} {cache.folder} for {path}", file=sys.stderr)
        return cache.lines(), cache.lengths()

    return lengths


def _check_result(split: str, result: ExpectationValidationResult, settings: ValidateSettings) -> CheckResult:
    config = _config(result)
    outcome = result.result or {}
    column = config.kwargs.get("column")
    unexpected = outcome.get("unexpected_count")
    checked = None
    if unexpected is not None:
        checked = int(outcome.get("element_count", 0)) - int(outcome.get("missing_count", 0))
    examples = tuple(
        f"line {int(item[LINE])}: {_show(item.get(column), raw=column in EXPLAINED)}"
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
        mostly=None if unexpected is None else settings.mostly_of(str(config.meta["check"])),
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
    elif isinstance(value, float) and value.is_integer():
        text = f"{int(value)}"  # token counts: pandas holds them as floats so that NaN can mark unusable rows
    else:
        text = str(value) if raw else repr(value)
    return text if len(text) <= EXAMPLE_CHARS else text[: EXAMPLE_CHARS - 1] + "…"
