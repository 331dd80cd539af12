"""The great-expectations suite: each split read into a frame (one row per line), the expectations, their results."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eksflow.runtime.args import StepInputError
from steps.common.base_model import resolve_model
from steps.common.data import FIELDS, SPLITS, read_lines, role_order_error

if TYPE_CHECKING:
    import pandas as pd
    from great_expectations.core import ExpectationSuite, ExpectationValidationResult
    from great_expectations.expectations.expectation_configuration import ExpectationConfiguration
from steps.validate_data import ValidateSettings

LINE = "line"  # column holding the 1-based line number: the index GE reports unexpected rows by


PARSE_ERROR = "parse_error"  # column holding why a line is not a JSON object, None when it is


DUPLICATE = "duplicate_of"  # column: which earlier line a row repeats, None for a first occurrence


ROLE_ERROR = "role_error"  # column: why a chat row's roles are out of order, None when in order or not chat


TOKENS = "tokens"  # column: the row's length in tokens as training encodes it, None for unusable rows


EXPLAINED = (PARSE_ERROR, DUPLICATE, ROLE_ERROR)  # columns whose values are already sentences: shown unquoted


EXAMPLES = 3


EXAMPLE_CHARS = 80


# (prompts, completions) -> token count of each pair
TokenCounter = Callable[[Sequence[str], Sequence[str]], list[int]]


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


def read_split(
    path: Path, count_tokens: TokenCounter | None = None, max_chars: dict[str, int] | None = None
) -> pd.DataFrame:
    """One row per non-blank line: line number, parse error, the fields present and their `<field>_type` names.

    Derived columns: duplicate_of (always), role_error (when any row has `messages`) and tokens (with a counter).
    Duplicates are looked for among rows that pass the field checks (within `max_chars` per field), so a bad row
    repeated is counted once, by its own check.
    """
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
    usable = [i for i, r in enumerate(records) if all(isinstance(r.get(f), str) and r[f].strip() for f in FIELDS)]
    limits = max_chars or {}
    first: dict[tuple[str, str], int] = {}
    duplicates: list[str | None] = [None] * len(records)
    for i in usable:
        if any(len(records[i][f]) > limits.get(f, len(records[i][f])) for f in FIELDS):
            continue
        pair = (records[i]["prompt"], records[i]["completion"])
        if pair in first:
            duplicates[i] = f"repeats line {first[pair]}"
        else:
            first[pair] = lines[i].number
    frame[DUPLICATE] = pd.Series(duplicates, dtype=object)
    if any("messages" in r for r in records):
        errors = [role_order_error(r["messages"]) if "messages" in r else None for r in records]
        frame[ROLE_ERROR] = pd.Series(errors, dtype=object)
    if count_tokens is not None:
        tokens: list[float] = [math.nan] * len(records)
        counts = count_tokens([records[i]["prompt"] for i in usable], [records[i]["completion"] for i in usable])
        for i, count in zip(usable, counts, strict=True):
            tokens[i] = float(count)
        frame[TOKENS] = pd.Series(tokens, dtype="float64")  # NaN for unusable rows: GE leaves them out
    return frame


def build_suite(
    split: str,
    data: pd.DataFrame,
    settings: ValidateSettings,
    train_prompts: list[str] | None,
    max_tokens: int = 0,
) -> ExpectationSuite:
    """The expectations for one split; `train_prompts` adds the no-overlap expectation (for eval)."""
    import great_expectations as gx

    # great_expectations re-exports its expectations without __all__, which mypy --strict calls implicit
    from great_expectations.expectations import (  # type: ignore[attr-defined]
        ExpectColumnToExist,
        ExpectColumnValueLengthsToBeBetween,
        ExpectColumnValuesToBeBetween,
        ExpectColumnValuesToBeNull,
        ExpectColumnValuesToBeOfType,
        ExpectColumnValuesToMatchRegex,
        ExpectColumnValuesToNotBeInSet,
        ExpectColumnValuesToNotBeNull,
        ExpectTableRowCountToBeBetween,
    )
    from great_expectations.expectations.row_conditions import Column

    mostly = settings.mostly_of
    suite = gx.ExpectationSuite(name=f"{split}_data")

    def add(check: str, expectation: Any) -> None:
        expectation.meta = {"check": check}
        suite.add_expectation(expectation)

    add("row_count", ExpectTableRowCountToBeBetween(min_value=settings.min_rows, max_value=None))
    add("lines_parse", ExpectColumnValuesToBeNull(column=PARSE_ERROR, mostly=mostly("lines_parse")))
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
    if ROLE_ERROR in data.columns:
        add(
            "role_order",
            ExpectColumnValuesToBeNull(column=ROLE_ERROR, mostly=mostly("role_order"), row_condition=usable),
        )
    if TOKENS in data.columns and max_tokens:
        add(
            "max_tokens",
            ExpectColumnValuesToBeBetween(column=TOKENS, max_value=max_tokens, mostly=mostly("max_tokens")),
        )
    if train_prompts and "prompt" in data.columns:
        add(
            "prompt_not_in_train",
            ExpectColumnValuesToNotBeInSet(
                column="prompt",
                value_set=train_prompts,
                mostly=mostly("prompt_not_in_train"),
                row_condition=Column("prompt_type") == "str",
            ),
        )
    return suite


def validate(
    dataset_dir: Path,
    settings: ValidateSettings,
    *,
    docs_dir: Path | None = None,
    count_tokens: TokenCounter | None = None,
    max_tokens: int = 0,
) -> Report:
    """Run the suites of both splits in one ephemeral great-expectations context.

    With `docs_dir`, the suites run as a checkpoint that renders Data Docs (index.html) there; with `count_tokens`
    and `max_tokens`, rows longer than max_tokens tokens fail the max_tokens check.
    """
    import great_expectations as gx
    from great_expectations.checkpoint.actions import UpdateDataDocsAction
    from great_expectations.data_context.types.base import ProgressBarsConfig

    frames = {}
    for split, name in SPLITS.items():
        path = dataset_dir / name
        if not path.is_file():
            raise StepInputError(f"{str(path)!r} does not exist; is --dataset-dir the folder stage_data published?")
        limits = {"prompt": settings.max_prompt_chars, "completion": settings.max_completion_chars}
        frames[split] = read_split(path, count_tokens if max_tokens else None, limits)

    train_prompts = _strings(frames["train"], "prompt")
    eval_prompts = _strings(frames["eval"], "prompt")
    train_set = set(train_prompts)
    overlap = sum(1 for p in eval_prompts if p in train_set)

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
    batches = context.data_sources.add_pandas("staged").add_dataframe_asset("split")
    whole = batches.add_batch_definition_whole_dataframe("whole")
    result_format = {
        "result_format": "SUMMARY",
        "unexpected_index_column_names": [LINE],
        "partial_unexpected_count": EXAMPLES,
    }
    checks: list[CheckResult] = []
    for split, data in frames.items():
        suite = build_suite(split, data, settings, sorted(train_set) if split == "eval" else None, max_tokens)
        order = [e.meta["check"] for e in suite.expectations if e.meta]
        if docs_dir is None:
            outcome = whole.get_batch(batch_parameters={"dataframe": data}).validate(suite, result_format=result_format)
        else:
            definition = context.validation_definitions.add(
                gx.ValidationDefinition(name=split, data=whole, suite=context.suites.add(suite))
            )
            checkpoint = context.checkpoints.add(
                gx.Checkpoint(
                    name=f"{split}_checkpoint",
                    validation_definitions=[definition],
                    actions=[UpdateDataDocsAction(name="data_docs")],
                    result_format=result_format,
                )
            )
            (outcome,) = checkpoint.run(batch_parameters={"dataframe": data}).run_results.values()
        results = sorted(outcome.results, key=lambda r: order.index(_config(r).meta["check"]))
        checks.extend(_check_result(split, r, settings) for r in results)
    return Report(
        dataset_dir=str(dataset_dir),
        settings=settings.model_dump(),
        rows={split: len(data) for split, data in frames.items()},
        overlap=overlap,
        checks=checks,
    )


def token_counter(base_model: str, cache_dir: Path | None = None) -> TokenCounter:
    """Count tokens with `base_model`'s tokenizer exactly as train encodes an example (before truncation)."""
    from steps.common.modeling import load_tokenizer, prompt_text

    tokenizer = load_tokenizer(resolve_model(base_model, cache_dir))

    def count(prompts: Sequence[str], completions: Sequence[str]) -> list[int]:
        if not prompts:
            return []
        prompt_ids = tokenizer([prompt_text(tokenizer, p) for p in prompts], add_special_tokens=False)["input_ids"]
        eos = tokenizer.eos_token or ""
        answer_ids = tokenizer([c + eos for c in completions], add_special_tokens=False)["input_ids"]
        return [len(p) + len(a) for p, a in zip(prompt_ids, answer_ids, strict=True)]

    return count


def _strings(data: pd.DataFrame, column: str) -> list[str]:
    if column not in data.columns:
        return []
    return [v for v in data[column] if isinstance(v, str)]


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
