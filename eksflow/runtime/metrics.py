"""Declaring a custom task metric: `@task_metric` marks a function of your module as one a config may name.

    from eksflow.runtime import task_metric

    @task_metric
    def starts_alike(answer: str, reference: str) -> float:
        return float(answer[:3] == reference[:3])

A config names it `package.module:starts_alike` (`evaluate.task_metrics`). The evaluate step, and the pipeline when
it validates the config, import that module and accept the name only if the module declared the function here:
whatever else is importable (os.system, builtins.eval, a class, an undecorated helper) cannot be named, because a
config is text anyone who can submit a run may write, and a metric runs on every answer the model gives.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import TypeVar

Metric = Callable[[str, str], float]
M = TypeVar("M", bound=Metric)

_DECLARED: dict[str, Metric] = {}  # "module:function" -> the function the decorator saw


def task_metric(function: M) -> M:
    """Declare `function(answer, reference) -> float in [0, 1]` (NaN: row not scored) a task metric; unchanged.

    It must be a plain function at the top level of its module, and this decorator the outermost one: the name a
    config uses is `<its module>:<its name>`, and the evaluate step checks that the module holds this very object.
    """
    qualname = getattr(function, "__qualname__", "")
    if not isinstance(function, types.FunctionType) or "." in qualname:
        raise TypeError(
            f"@task_metric applies to a function defined at the top level of a module, not {function!r}: "
            "a config names it as 'package.module:function'"
        )
    _DECLARED[f"{function.__module__}:{qualname}"] = function
    return function


def declared(reference: str) -> Metric | None:
    """The function a module declared with @task_metric under `module:function`, or None."""
    return _DECLARED.get(reference)
