"""Values spelled as Argo's controller spells them: Go's encoding/json (compact, sorted keys, HTML escaped)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any

_HTML_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def go_json(value: Any) -> str:
    """`value` as Go's json.Marshal writes it: compact, sorted keys, HTML characters escaped, Go's numbers."""
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _go_float(value)
    if isinstance(value, str):
        encoded = json.dumps(value, ensure_ascii=False)
        return "".join(_HTML_ESCAPES.get(c, c) for c in encoded)
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{go_json(str(k))}:{go_json(value[k])}" for k in sorted(value)) + "}"
    if isinstance(value, Sequence):
        return "[" + ",".join(go_json(v) for v in value) + "]"
    raise TypeError(f"not a JSON value: {value!r}")


def _go_float(value: float) -> str:
    if math.isnan(value) or math.isinf(value):
        raise ValueError(f"{value!r} is not a JSON number")
    magnitude = abs(value)
    if magnitude != 0 and (magnitude < 1e-6 or magnitude >= 1e21):
        text = repr(value)  # shortest round-trip digits in exponent form, as Go's 'e' with precision -1
        mantissa, _, exponent = text.partition("e")
        sign, digits = exponent[0], exponent[1:].lstrip("0") or "0"
        return f"{mantissa}e{sign}{digits}"  # Go cleans e-07 to e-7
    text = format(Decimal(repr(value)), "f")  # the same digits, positional ('f' with precision -1)
    return text.rstrip("0").rstrip(".") if "." in text else text
