"""Adding up great-expectations results over the chunks of one split, by GE's own rules.

A per-row expectation run on chunks of a split is the same expectation run on the whole split when the counts are
summed (element, missing and unexpected rows), the success is decided again from the sums the way GE decides it
(vacuously true without rows to judge, else (checked - unexpected) / checked >= mostly, in floats, as GE's
`_mostly_success` computes it) and the examples are the first ones in line order (the chunks are in line order).
A table-level expectation (row count, column exists) is not split: the caller runs it once.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from great_expectations.core import ExpectationValidationResult

COUNTS = ("element_count", "missing_count", "unexpected_count")
PARTIAL = ("partial_unexpected_list", "partial_unexpected_index_list")


def mostly_success(checked: int, unexpected: int, mostly: float) -> bool:
    """GE's rule for a per-row expectation with `mostly` (great_expectations.expectations.expectation)."""
    return (float(checked) - float(unexpected)) / float(checked) >= mostly


def merge(parts: Sequence[ExpectationValidationResult], examples: int) -> ExpectationValidationResult:
    """One result for an expectation from its results on consecutive chunks (the first chunk's config and meta)."""
    from great_expectations.core import ExpectationValidationResult

    first = parts[0]
    if len(parts) == 1:
        return first
    failed = next((p for p in parts if _raised(p.exception_info)), None)
    if failed is not None:  # an error in any chunk is the error of the whole
        return failed
    results = [p.result or {} for p in parts]
    if first.result is None or results[0].get("unexpected_count") is None:
        return first  # not a per-row expectation: identical on every chunk (the caller runs row_count once)
    total: dict[str, Any] = dict(results[0])
    for name in COUNTS:
        if any(name in r for r in results):
            total[name] = sum(int(r.get(name) or 0) for r in results)
    for name in PARTIAL:
        if name in total:
            total[name] = [item for r in results for item in r.get(name, [])][:examples]
    element = int(total.get("element_count", 0))
    missing = int(total.get("missing_count", 0))
    unexpected = int(total["unexpected_count"])
    checked = element - missing
    _percentages(total, element, missing, unexpected, checked)
    if "partial_unexpected_counts" in total:
        counted = Counter(repr(v) for v in total.get("partial_unexpected_list", []))
        values = {repr(v): v for v in total.get("partial_unexpected_list", [])}
        total["partial_unexpected_counts"] = [{"value": values[k], "count": n} for k, n in counted.most_common()]
    config = first.expectation_config
    mostly_kwarg = config.kwargs.get("mostly") if config is not None else None
    mostly = 1.0 if mostly_kwarg is None else float(mostly_kwarg)  # GE's default: every row
    success = True if element == 0 or checked == 0 else mostly_success(checked, unexpected, mostly)
    return ExpectationValidationResult(
        success=success,
        expectation_config=config,
        result=total,
        meta=first.meta,
        exception_info=first.exception_info,
    )


def _percentages(total: dict[str, Any], element: int, missing: int, unexpected: int, checked: int) -> None:
    """GE's percentages from the summed counts (unexpected_percent is of the rows judged, i.e. non-missing)."""
    if "missing_count" in total:
        total["missing_percent"] = 100.0 * missing / element if element else None
        total["unexpected_percent_total"] = 100.0 * unexpected / element if element else None
        total["unexpected_percent_nonmissing"] = 100.0 * unexpected / checked if checked else None
    total["unexpected_percent"] = 100.0 * unexpected / checked if checked else None


def _raised(info: dict[str, Any] | None) -> bool:
    """Whether GE caught an exception; its shape differs between expectation and metric errors."""
    if not info:
        return False
    found = [info] if "raised_exception" in info else [v for v in info.values() if isinstance(v, dict)]
    return any(i.get("raised_exception") for i in found)
