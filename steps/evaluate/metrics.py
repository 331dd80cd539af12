"""Task metrics: how one answer is scored against its reference, in [0, 1]. Pure; no model involved.

Built in (`evaluate.task_metrics`):
    exact_match  the answer equals the reference, whitespace-trimmed (case-sensitive)
    contains     the reference occurs in the answer
    json_match   both parse as JSON and are equal as values (key order and spacing do not matter); 0 when the
                 answer is not JSON; NaN for a row whose reference is not JSON, so it is left out of the mean
    rouge_l      ROUGE-L F1 over whitespace tokens: partial credit for free text (summaries, rewrites)
A user's own metric is given by import path, `package.module:function`, a function (answer, reference) -> float
in [0, 1] (NaN leaves the row out); the module must be importable by the evaluate step (e.g. in the project's
steps package).

A task metric's value on the eval set is the mean over the rows it scores; no row scored gives NaN, which every
threshold fails closed on.
"""

from __future__ import annotations

import importlib
import json
import math
import re
from collections.abc import Callable, Sequence

Metric = Callable[[str, str], float]
IMPORT_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


def exact_match(answer: str, reference: str) -> float:
    """1.0 when the answer is the reference (whitespace-trimmed)."""
    return float(answer.strip() == reference.strip())


def contains(answer: str, reference: str) -> float:
    """1.0 when the reference occurs in the answer."""
    return float(reference.strip() in answer)


def json_match(answer: str, reference: str) -> float:
    """1.0 when answer and reference are equal JSON values; NaN when the reference is not JSON."""
    try:
        expected = json.loads(reference)
    except ValueError:
        return math.nan
    try:
        return float(json.loads(_json_part(answer)) == expected)
    except ValueError:
        return 0.0


def rouge_l(answer: str, reference: str) -> float:
    """ROUGE-L F1: longest common subsequence of whitespace tokens, as precision and recall's harmonic mean."""
    a, r = answer.split(), reference.split()
    if not a or not r:
        return float(a == r)
    lcs = _lcs(a, r)
    if lcs == 0:
        return 0.0
    precision, recall = lcs / len(a), lcs / len(r)
    return 2 * precision * recall / (precision + recall)


BUILT_IN: dict[str, Metric] = {
    "exact_match": exact_match,
    "contains": contains,
    "json_match": json_match,
    "rouge_l": rouge_l,
}


def check_name(name: str) -> str:
    """`name` when it is a built-in metric or an import path; ValueError naming the choices otherwise."""
    if name in BUILT_IN or IMPORT_PATH.fullmatch(name):
        return name
    raise ValueError(
        f"unknown task metric {name!r}: use one of {', '.join(BUILT_IN)} or your own as 'package.module:function'"
    )


def resolve(name: str) -> Metric:
    """The function scoring metric `name` (a user's is imported here, in the evaluate step)."""
    if name in BUILT_IN:
        return BUILT_IN[name]
    module_name, _, attribute = check_name(name).partition(":")
    try:
        function = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as err:
        raise ValueError(
            f"task metric {name!r} cannot be imported ({err}); is its module in the step's image?"
        ) from err
    if not callable(function):
        raise ValueError(f"task metric {name!r} is not a function")
    return function  # type: ignore[no-any-return]


def score(metric: Metric, answers: Sequence[str], references: Sequence[str]) -> float:
    """Mean of `metric` over the rows it scores (NaN rows left out); NaN when it scores none."""
    values = []
    for answer, reference in zip(answers, references, strict=True):
        value = float(metric(answer, reference))
        if math.isnan(value):
            continue
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"a task metric returned {value}; it must be in [0, 1] (or NaN to skip the row)")
        values.append(value)
    return sum(values) / len(values) if values else math.nan


def _json_part(answer: str) -> str:
    """The JSON in an answer, without a markdown code fence around it."""
    fenced = re.fullmatch(r"\s*```(?:json)?\s*(.*?)\s*```\s*", answer, re.DOTALL)
    return fenced.group(1) if fenced else answer


def _lcs(a: Sequence[str], b: Sequence[str]) -> int:
    previous = [0] * (len(b) + 1)
    for x in a:
        current = [0]
        for j, y in enumerate(b):
            current.append(previous[j] + 1 if x == y else max(previous[j + 1], current[j]))
        previous = current
    return previous[-1]
