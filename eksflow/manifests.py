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
subdomain, a uid a UUID, `retries` an integer; none can hold YAML syntax.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import yaml

from eksflow.errors import EksflowError

SAFE_REFERENCES = frozenset({"workflow.name", "workflow.namespace", "workflow.uid", "retries"})
REFERENCE = re.compile(r"\{\{\s*([^{}]*?)\s*\}\}")  # as Argo (and eksflow.local.substitution) reads a tag
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_TOKEN = "eksflow-expression-{}"  # a plain YAML scalar that marks where an expression tag goes
_PLACED = re.compile(r"(?<= )eksflow-expression-(\d+)$", re.MULTILINE)  # `key: <marker>` or `- <marker>`


class ManifestError(EksflowError, ValueError):
    """An object that cannot become manifest text safely; the message names the field."""


def manifest_text(obj: Mapping[str, Any]) -> str:
    """`obj` as YAML for a resource template's `manifest`: every string with a reference becomes an expression tag."""
    expressions: list[str] = []

    def mark(value: Any, where: str) -> Any:
        if isinstance(value, Mapping):
            for key in value:
                if "{{" in str(key):
                    raise ManifestError(f"{where}: a key cannot hold a reference ({key!r}); put it in a value")
            return {key: mark(item, f"{where}.{key}") for key, item in value.items()}
        if isinstance(value, list | tuple):
            return [mark(item, f"{where}[{i}]") for i, item in enumerate(value)]
        if isinstance(value, str):
            if _TOKEN.format("") in value:
                raise ManifestError(f"{where}: {value!r} holds eksflow's own marker text")
            if any(ref not in SAFE_REFERENCES for ref in REFERENCE.findall(value)):
                expressions.append(expression(value, where))
                return _TOKEN.format(len(expressions) - 1)
        return value

    text = yaml.safe_dump(mark(obj, str(obj.get("kind", "object"))), sort_keys=False)
    placed: list[int] = []

    def place(match: re.Match[str]) -> str:
        placed.append(int(match.group(1)))
        return "{{=" + expressions[placed[-1]] + "}}"

    text = _PLACED.sub(place, text)
    if sorted(placed) != list(range(len(expressions))):  # each marker once, as a whole plain scalar
        raise ManifestError(f"an expression could not be placed as a whole YAML value in {obj.get('kind')!r}")
    return text


def expression(text: str, where: str = "value") -> str:
    """The expr-lang expression whose toJson is `text` with its references substituted.

    `--model={{inputs.parameters.model_dir}}` -> `toJson("--model=" + inputs.parameters.model_dir)`.
    """
    terms: list[str] = []
    position = 0
    for match in REFERENCE.finditer(text):
        if match.start() > position:
            terms.append(literal(text[position : match.start()]))
        reference = match.group(1)
        if reference.startswith("="):
            raise ManifestError(f"{where}: {text!r} already holds an expression tag; give the value, not an expression")
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
