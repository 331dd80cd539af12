"""Argo's substitution of a template, done the way its controller does it (util/template), for the tests.

The controller JSON-marshals the template, replaces every `{{tag}}` in that JSON text and unmarshals the result:
- a simple tag's value is written strconv.Quote-escaped, so it stays inside its JSON string: a resource manifest,
  one JSON string, gets the raw value back in its YAML text (which is why eksflow never writes one there);
- an expression tag `{{=expr}}` has the JSON escapes of its text undone, is run by expr over the variables, and its
  result is written json.Marshal-ed with the surrounding quotes trimmed (a string result: its text).
Expressions run through the local executor's expr subset (eksflow/local/expression_tags.py, tested against
expr-lang's rules in tests/unit/local/test_expression_tags.py).
"""

import json
import re
import unicodedata
from collections.abc import Callable, Mapping
from typing import Any

import yaml

from eksflow.local import expression_tags
from eksflow.manifests import REFERENCE

_GO_ESCAPES = {'"': '\\"', "\\": "\\\\", "\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def strconv_quote(value: str) -> str:
    """Go's strconv.Quote without the quotes: what a simple tag writes into the template's JSON."""
    out = []
    for char in value:
        if char in _GO_ESCAPES:
            out.append(_GO_ESCAPES[char])
        elif char == "\v":
            out.append("\\v")
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            out.append(f"\\x{ord(char):02x}")
        elif not char.isprintable() and unicodedata.category(char) != "Zs":
            out.append(f"\\u{ord(char):04x}" if ord(char) <= 0xFFFF else f"\\U{ord(char):08x}")
        else:
            out.append(char)
    return "".join(out)


def substitute(template: Mapping[str, Any], value: Callable[[str], str]) -> dict[str, Any]:
    """`template` after Argo's substitution; `value` gives a variable's value by its dotted name."""

    def replace(match: re.Match[str]) -> str:
        tag = match.group(1)
        if not tag.startswith("="):
            return strconv_quote(value(tag))
        result = expression_tags.evaluate(json.loads(f'"{tag[1:]}"'), value)
        return json.dumps(result, ensure_ascii=False)[1:-1]

    return json.loads(REFERENCE.sub(replace, json.dumps(template, ensure_ascii=False)))


def unresolved(name: str) -> str:
    """A variable's own tag as its value: the object reads as rendered, `{{inputs.parameters.x}}` where x goes."""
    return "{{" + name + "}}"


def manifest_object(template: Mapping[str, Any], value: Callable[[str], str] = unresolved) -> Any:
    """The object a resource template creates, once Argo has substituted its manifest."""
    return yaml.safe_load(substitute(template, value)["resource"]["manifest"])


def resource_objects(workflow: Mapping[str, Any], value: Callable[[str], str] = unresolved) -> dict[str, Any]:
    """Template name -> the object of every resource template of a rendered workflow."""
    return {t["name"]: manifest_object(t, value) for t in workflow["spec"]["templates"] if "resource" in t}
