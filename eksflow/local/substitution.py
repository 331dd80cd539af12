"""`{{...}}` references, fan-out items and aggregated outputs, with the values Argo would produce.

Substitution is ONE pass over a text: a substituted value is never scanned again, so a parameter holding
`{{workflow.name}}` or `$(cmd)` reaches its step byte-identical.

Items and aggregates are written the way Argo's controller writes them (Go's encoding/json): a string item is
itself, a number keeps its JSON spelling (`0.0001`, `1e-7`), a mapping is compact JSON with sorted keys, and a
fan-out node is named `task(index:item)`, a mapping item as `key:value` pairs sorted and joined by commas
(`candidates(0:lr:0.0001,rank:8)`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from eksflow.errors import EXIT_BAD_INPUT, EksflowError
from eksflow.local import expression_tags
from eksflow.local.gojson import go_json
from eksflow.manifests import REFERENCE

TASK_REFERENCE = re.compile(r"\{\{\s*tasks\.([\w\-]+)\.")
PLACEHOLDER = "eksflow-placeholder"  # stands in for every {{...}} when a manifest is checked before the run


class UnresolvedError(EksflowError):
    """A `{{...}}` reference with no value; the message names it."""

    label = "unresolved reference"
    exit_code = EXIT_BAD_INPUT


def substitute(text: str, lookup: Callable[[str], str]) -> str:
    """Replace every `{{ ref }}` in ONE pass: a substituted value is never scanned again."""
    return REFERENCE.sub(lambda m: lookup(m.group(1)), text)


def item_text(value: Any) -> str:
    """An item (or a field of one) as `{{item}}` / `{{item.key}}` gives it: strings bare, the rest as JSON."""
    return value if isinstance(value, str) else go_json(value)


def iteration_name(task: str, index: int, item: Any) -> str:
    """The node name of one iteration of a fanned-out task, as Argo generates it."""
    if isinstance(item, Mapping):
        description = ",".join(sorted(f"{k}:{item_text(v)}" for k, v in item.items()))
    else:
        description = item_text(item)
    return f"{task}({index}:{description.replace('(', '').replace(')', '')})"


def item_lookup(item: Any, ref: str) -> str | None:
    """The value of `item` or `item.<key>` for this iteration; None if `ref` is not about the item."""
    if ref == "item":
        return item_text(item)
    if ref.startswith("item.") and isinstance(item, Mapping):
        key = ref.removeprefix("item.")
        if key in item:
            return item_text(item[key])
        have = ", ".join(sorted(map(str, item))) or "none"
        raise UnresolvedError(f"{{{{{ref}}}}}: this item has no key {key!r} (it has: {have})")
    return None


def parse_items(text: str, where: str) -> list[Any]:
    """A withParam value: a JSON list (Argo refuses anything else)."""
    try:
        items = json.loads(text)
    except ValueError as exc:
        raise UnresolvedError(f"{where} could not be parsed as a JSON list: {text.strip()[:200]!r}: {exc}") from None
    if not isinstance(items, list):
        raise UnresolvedError(f"{where} must be a JSON list, got {text.strip()[:200]!r}")
    return items


def aggregate(values: Sequence[str]) -> str:
    """A fanned-out task's output parameter across its iterations, as Argo aggregates it.

    A JSON list in iteration order: of the parsed values if every one is a JSON object or list, else of the values
    as strings (so numbers stay strings: ["0.5","0.75"]).
    """
    parsed: list[Any] = []
    for value in values:
        try:
            loaded = json.loads(value)
        except ValueError:
            return go_json(list(values))
        if not isinstance(loaded, (dict, list)):
            return go_json(list(values))
        parsed.append(loaded)
    return go_json(parsed)


def aggregate_maps(outputs: Sequence[Mapping[str, str]]) -> str:
    """`tasks.X.outputs.parameters` of a fanned-out task: a JSON list of each iteration's parameters."""
    return go_json([dict(o) for o in outputs if o])


_NO_ITEM = object()


class Scope:
    """What `{{...}}` can name where a task's fields are substituted: workflow, inputs, tasks, item, retries."""

    def __init__(
        self,
        workflow: Mapping[str, str],
        inputs: Mapping[str, str] | None = None,
        *,
        tasks: Callable[[str, list[str]], str] | None = None,
        item: Any = _NO_ITEM,
        retries: int | None = None,
    ) -> None:
        self.workflow = workflow  # "name", "uid", "namespace", "parameters.x", "status"
        self.inputs = inputs or {}
        self.tasks = tasks  # (task name, rest of the reference split on ".") -> value; raises UnresolvedError
        self.item = item
        self.retries = retries

    def with_item(self, item: Any) -> Scope:
        """This scope inside one iteration of a fan-out."""
        return Scope(self.workflow, self.inputs, tasks=self.tasks, item=item, retries=self.retries)

    def lookup(self, ref: str) -> str:
        """The value of one reference; raises UnresolvedError naming it."""
        if ref.startswith("="):  # an expression tag: the variables it names are these same references
            try:
                return expression_tags.evaluate(ref[1:], self.lookup)
            except expression_tags.ExpressionTagError as exc:
                raise UnresolvedError(str(exc)) from None
        head, _, rest = ref.partition(".")
        if head == "workflow" and rest in self.workflow:
            return self.workflow[rest]
        if head == "inputs" and rest.startswith("parameters.") and rest.removeprefix("parameters.") in self.inputs:
            return self.inputs[rest.removeprefix("parameters.")]
        if head == "retries" and not rest and self.retries is not None:
            return str(self.retries)
        if head == "item" and self.item is not _NO_ITEM:
            value = item_lookup(self.item, ref)
            if value is not None:
                return value
        if head == "tasks" and self.tasks is not None and rest:
            name, _, attribute = rest.partition(".")
            return self.tasks(name, attribute.split(".") if attribute else [])
        raise UnresolvedError(f"unresolved reference {{{{{ref}}}}}: no such value here")

    def substitute(self, text: str) -> str:
        """`text` with every reference replaced, in one pass."""
        return substitute(text, self.lookup)
