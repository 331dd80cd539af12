"""Kubernetes objects as the manifest text of Argo resource templates, every parameter travelling as data.

Argo substitutes `{{...}}` in a resource template's manifest as text and only then parses it as YAML, so a value
holding a quote and a newline there adds fields to the object (`hostPID: true`, an initContainer running nsenter).
Here no string that holds a parameter, task output or item reference is written with the reference inside it: the
whole YAML scalar becomes an expression tag that Argo's expr evaluates and JSON-encodes,

    value: {{=toJson(inputs.parameters.dataset_dir)}}
    - {{=toJson("--base-model=" + workflow.parameters.base_model)}}

and a JSON string is a YAML double-quoted scalar: the value arrives as one string, whatever it holds. Argo accepts
unquoted expression tags in a manifest (its validation puts placeholders in their place before checking that the
manifest is YAML, workflow/validate), and the local executor evaluates them as Argo's expr does
(eksflow/local/expression_tags.py).

Names that Argo generates and Kubernetes constrains stay plain tags (SAFE_REFERENCES): a workflow name is a DNS
subdomain, a uid a UUID, `retries` an integer; none can hold YAML syntax. Any other `{{` in a string (text that is
no reference, a brace before a tag: `x{{{workflow.name}}`) makes the string an expression too, whose literal parts
have their braces escaped: the manifest text holds no `{{` but eksflow's own tags. The object is JSON data (what
the API server takes): text, numbers, bools, null, lists and mappings with text keys; a set, bytes or any other
Python object is refused, naming where it is, rather than written as a YAML tag (`!!set`, `!!binary`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping
from typing import Any

import yaml

from eksflow.errors import EXIT_BAD_INPUT, EksflowError

SAFE_REFERENCES = frozenset({"workflow.name", "workflow.namespace", "workflow.uid", "retries"})
REFERENCE = re.compile(r"\{\{\s*([^{}]*?)\s*\}\}")  # as Argo (and eksflow.local.substitution) reads a tag
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_EXPRESSION_TAG = re.compile(r"\{\{\s*=")  # how Argo tells an expression tag from a simple one
_MARKER = "eksflow-expression"  # a plain YAML scalar `<marker>-<n>` marks where expression tag n goes


class ManifestError(EksflowError, ValueError):
    """An object that cannot become manifest text safely; the message names the field."""

    label = "manifest error"
    exit_code = EXIT_BAD_INPUT


def manifest_text(obj: Mapping[str, Any]) -> str:
    """`obj` as YAML for a resource template's `manifest`: every string with a reference becomes an expression tag."""
    expressions: list[str] = []
    kind = str(obj.get("kind", "object"))
    # A marker no string of the object holds, so that a value that looks like one stays a value.
    strings = list(_strings(obj, kind))
    marker, n = f"{_MARKER}-", 0
    while any(marker in text for text in strings):
        n += 1
        marker = f"{_MARKER}{n}-"

    def mark(value: Any, where: str) -> Any:
        if isinstance(value, Mapping):
            for key in value:
                if "{{" in key:
                    raise ManifestError(f"{where}: a key cannot hold a reference ({key!r}); put it in a value")
            return {key: mark(item, f"{where}.{key}") for key, item in value.items()}
        if isinstance(value, list | tuple):
            return [mark(item, f"{where}[{i}]") for i, item in enumerate(value)]
        if isinstance(value, str) and not plain(value):
            expressions.append(expression(value, where))
            return f"{marker}{len(expressions) - 1}"
        return value

    text = yaml.safe_dump(mark(obj, kind), sort_keys=False)
    placed: list[int] = []

    def place(match: re.Match[str]) -> str:
        placed.append(int(match.group(1)))
        return "{{=" + expressions[placed[-1]] + "}}"

    # `key: <marker>` or `- <marker>`: a whole plain scalar
    text = re.sub(rf"(?<= ){re.escape(marker)}(\d+)$", place, text, flags=re.MULTILINE)
    if sorted(placed) != list(range(len(expressions))):  # each marker once, as a whole plain scalar
        raise ManifestError(f"an expression could not be placed as a whole YAML value in {obj.get('kind')!r}")
    return text


def plain(text: str) -> bool:
    """Whether `text` can be written as it is: no `{{` but whole tags of names Argo generates."""
    if "{{" not in text:
        return True
    tags = REFERENCE.findall(text)
    return all(tag in SAFE_REFERENCES for tag in tags) and "{{" not in REFERENCE.sub("", text) and "{{{" not in text


def _strings(value: Any, where: str) -> Iterator[str]:
    """Every key and string of a manifest; ManifestError naming where a value is no JSON value."""
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise ManifestError(f"{where}: the key {key!r} is {type(key).__name__}; a manifest's keys are text")
            yield key
            yield from _strings(item, f"{where}.{key}")
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            yield from _strings(item, f"{where}[{i}]")
    elif isinstance(value, str):
        yield value
    elif isinstance(value, float) and not math.isfinite(value):
        raise ManifestError(f"{where}: {value!r} is no JSON number; give a finite number")
    elif value is not None and not isinstance(value, bool | int | float):
        raise ManifestError(
            f"{where}: a value of type {type(value).__name__} is no JSON value; give text, a number, a bool, null, "
            "a list or a mapping (a set as a list, bytes as text)"
        )


def expression(text: str, where: str = "value") -> str:
    """The expr-lang expression whose toJson is `text` with its references substituted.

    `--model={{inputs.parameters.model_dir}}` -> `toJson("--model=" + inputs.parameters.model_dir)`.
    """
    if _EXPRESSION_TAG.search(text):
        raise ManifestError(f"{where}: {text!r} already holds an expression tag; give the value, not an expression")
    terms: list[str] = []
    position = 0
    for match in REFERENCE.finditer(text):
        if match.start() > position:
            terms.append(literal(text[position : match.start()]))
        reference = match.group(1)
        terms.append(variable(reference, where))
        position = match.end()
    if position < len(text):
        terms.append(literal(text[position:]))
    return f"toJson({' + '.join(terms)})"


def variable(reference: str, where: str = "value") -> str:
    """An Argo reference as an expr-lang member path: `tasks.a-b.outputs.x` -> `tasks["a-b"].outputs.x`."""
    parts = reference.split(".")
    if not parts[0] or not _IDENTIFIER.fullmatch(parts[0]) or not all(parts):
        raise ManifestError(f"{where}: {{{{{reference}}}}} is not a reference expr can read")
    return parts[0] + "".join(f".{p}" if _IDENTIFIER.fullmatch(p) else f"[{literal(p)}]" for p in parts[1:])


def literal(text: str) -> str:
    """`text` as an expr-lang string literal that holds no quote, brace or control character unescaped.

    Braces are escaped so that no `}}` ends the tag early (Argo finds a tag's end by the first `}}`).
    """
    out = []
    for char in text:
        code = ord(char)
        if 0x20 <= code < 0x7F and char not in "\"'\\{}":
            out.append(char)
        elif code <= 0xFFFF:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    return '"' + "".join(out) + '"'
