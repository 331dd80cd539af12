"""Why a task was skipped, in its pipeline's words: a `when=` may carry the reason (eksflow.conditions).

    when=staged.changed.otherwise(staged.reason)       a text output of a task of the same DAG (stage_data's)
    when=scored.passed.otherwise("the gate failed")    the pipeline's own text

Argo says only `when '(false == true)' evaluated false`. The reason travels beside the expression, never inside it:
as an annotation of the skipped task's template, REASON_OUTPUT naming the output (`<task>.<output>`) or REASON
holding the text. The local executor gives it as the skipped node's message, and the report reads it the same way
from a cluster's Workflow, whose nodes hold the outputs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

REASON = "eksflow.dev/skipped-because"
REASON_OUTPUT = "eksflow.dev/skipped-because-output"


def skip_reason(annotations: Mapping[str, object], output: Callable[[str, str], str | None]) -> str:
    """The reason a template's annotations give for skipping its task, or "" when they give none.

    `output(task, name)` reads an output of a task of the same DAG (None when it has no such value).
    """
    named = str(annotations.get(REASON_OUTPUT) or "")
    if named:
        task, _, name = named.partition(".")
        return (output(task, name) or "") if name else ""
    return str(annotations.get(REASON) or "")
