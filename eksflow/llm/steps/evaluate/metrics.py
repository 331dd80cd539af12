"""Task metrics: how one answer is scored against its reference, in [0, 1]. Pure; no model involved.

Built in (`evaluate.task_metrics`):
    exact_match  the answer equals the reference, whitespace-trimmed (case-sensitive)
    contains     the reference occurs in the answer
    json_match   both parse as JSON and are equal as values (key order and spacing do not matter); 0 when the
                 answer is not JSON; NaN for a row whose reference is not JSON, so it is left out of the mean
    rouge_l      ROUGE-L F1 over whitespace tokens: partial credit for free text (summaries, rewrites)
A user's own metric is named `package.module:function`: a function (answer, reference) -> float in [0, 1] (NaN
leaves the row out) that its module declares with `@eksflow.runtime.task_metric`. The config is text, so a name
is trusted only that far: the module must be a file of one of this project's own packages, found on the file system
before anything is imported (eksflow.runtime.metrics: eksflow, the standard library and installed packages are
refused unimported); it is then imported (which runs its top level, as any import does), and the name is refused
unless the module declared that very function, with a signature that takes (answer, reference). Nothing is called
to check it. The project is the pipeline's (eksflow.runtime.metrics.project_root): the folder of its packages while
its config is checked, the step's working directory when it runs (that folder locally, /app in the step's image).

Where a metric is named once `task_metrics` lists it (a threshold, `champion_metric`, `canary.task_metric`), the
function's name alone (its short name, `function`) will do when no other listed metric has it: `configured`
matches it among the listed names as text, so a short name never leads to a module the config did not list.

A task metric's value on the eval set is the mean over the rows it scores; no row scored gives NaN, which every
threshold fails closed on.
"""

from __future__ import annotations

import inspect
import json
import math
import numbers
import re
from collections.abc import Sequence

from eksflow.runtime.metrics import Metric, declared, project_module, project_root

IMPORT_PATH = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$")
HOW_TO_DECLARE = (
    "a custom metric is a function of a module in this project's own packages (e.g. steps/my_metrics.py) marked "
    "with @eksflow.runtime.task_metric, taking (answer, reference) and returning a float in [0, 1]"
)


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


def short_name(metric: str) -> str:
    """A metric's name without its module: `starts_alike` for `steps.my_metrics:starts_alike`; a built-in's own."""
    return metric.rpartition(":")[2]


def configured(name: str, task_metrics: Sequence[str]) -> str | None:
    """The metric of `task_metrics` that `name` names, by its full name or a custom one by its short name; or None.

    A full name wins (`exact_match` is the built-in even beside a custom `pkg.mod:exact_match`). Pure text: nothing
    is imported. ValueError, naming both, when two listed custom metrics have that short name.
    """
    if name in task_metrics:
        return name
    matches = [metric for metric in task_metrics if ":" in metric and short_name(metric) == name]
    if len(matches) > 1:
        raise ValueError(f"{name!r} is the short name of both {' and '.join(matches)}; name the one you mean in full")
    return matches[0] if matches else None


def shown(task_metrics: Sequence[str]) -> list[str]:
    """The names to offer for `task_metrics`: a custom metric's short name where that names it alone, else its full."""
    shorts = [short_name(metric) for metric in task_metrics]
    return [
        metric if ":" in metric and shorts.count(short) > 1 else short
        for metric, short in zip(task_metrics, shorts, strict=True)
    ]


def resolve(name: str) -> Metric:
    """The function scoring metric `name`: a built-in, or a function its module declared with @task_metric.

    ValueError saying what is wrong with the name and how to declare a metric otherwise.
    """
    if name in BUILT_IN:
        return BUILT_IN[name]
    if not IMPORT_PATH.fullmatch(name):
        raise ValueError(
            f"unknown task metric {name!r}: use one of {', '.join(BUILT_IN)} or your own as 'package.module:function'"
        )
    module_name, _, attribute = name.partition(":")
    try:
        module = project_module(module_name, project_root())
    except ValueError as err:
        raise ValueError(f"task metric {name!r}: {err}; {HOW_TO_DECLARE}") from err
    function = declared(name)
    # The module's own attribute, read without getattr (a module __getattr__ would run code): it must be the
    # declared function itself, not a name rebound to something else after the decorator ran.
    exposed: object = vars(module).get(attribute)
    if function is None or exposed is not function:
        raise ValueError(f"task metric {name!r} is not declared a metric by {module_name}; {HOW_TO_DECLARE}")
    _check_signature(name, function)
    return function


def _check_signature(name: str, function: Metric) -> None:
    """ValueError unless `function` can be called as function(answer, reference) and returns (not awaits) a value."""
    if inspect.iscoroutinefunction(function) or inspect.isgeneratorfunction(function):
        raise ValueError(f"task metric {name!r} is a coroutine or generator function; {HOW_TO_DECLARE}")
    try:
        inspect.signature(function).bind("answer", "reference")
    except TypeError as err:
        raise ValueError(
            f"task metric {name!r} cannot be called as {name.partition(':')[2]}(answer, reference) ({err}); "
            f"{HOW_TO_DECLARE}"
        ) from err


def score(metric: Metric, answers: Sequence[str], references: Sequence[str]) -> float:
    """Mean of `metric` over the rows it scores (NaN rows left out); NaN when it scores none."""
    values: list[float] = []
    for answer, reference in zip(answers, references, strict=True):
        raw = metric(answer, reference)
        if isinstance(raw, bool) or not isinstance(raw, numbers.Real):
            raise ValueError(
                f"a task metric returned {raw!r}; it must return a float in [0, 1] (or NaN to skip the row)"
            )
        value = float(raw)
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
