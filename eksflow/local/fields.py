"""Reading the fields of a parsed YAML manifest, with errors that name the field and the fix.

The Workflow (manifest.py, parse_templates.py) and the objects its resource templates create (resources.py) are
read the same way but fail differently: a bad Workflow is refused before the run starts, a bad resource manifest
met at run time fails only its task. So each binds a FieldReader to its own error class and to its hints for
unsupported keys.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Set
from typing import Any

UNSUPPORTED_HINT = "remove it, or run on a cluster with `submit`"


class FieldReader:
    """Typed readers of manifest fields that raise `error` naming the field (`where`) and what to do."""

    def __init__(self, error: type[Exception], hints: Mapping[str, str]) -> None:
        self.error = error
        self.hints = hints  # unsupported key -> what to do instead (default: UNSUPPORTED_HINT)

    def check_keys(self, obj: Mapping[str, Any], where: str, used: Set[str], ignored: Set[str] = frozenset()) -> None:
        """Refuse any key that is neither used nor ignored (cluster-only: nothing to apply it to here)."""
        for key in obj:
            if key not in used and key not in ignored:
                raise self.error(f"{where}.{key} is not supported locally; {self.hints.get(key, UNSUPPORTED_HINT)}")

    def mapping(self, value: Any, where: str) -> Mapping[str, Any]:
        """A mapping; an absent one reads as empty."""
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            raise self.error(f"{where} must be a mapping, got {type(value).__name__}")
        return value

    def mappings(self, value: Any, where: str) -> list[Mapping[str, Any]]:
        """A list of mappings; an absent one reads as empty."""
        if value is None:
            return []
        if not isinstance(value, list):
            raise self.error(f"{where} must be a list, got {type(value).__name__}")
        return [self.mapping(item, f"{where}[{i}]") for i, item in enumerate(value)]

    def text(self, value: Any, where: str) -> str:
        """A string; YAML reads `1` and `0.5` as numbers, which Kubernetes takes where a string is expected."""
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise self.error(f"{where} must be a string, got {value!r}")
        return str(value)

    def optional_text(self, obj: Mapping[str, Any], key: str, where: str) -> str | None:
        """`obj[key]` as a string, None if absent."""
        return None if obj.get(key) is None else self.text(obj[key], f"{where}.{key}")

    def env(self, container: Mapping[str, Any], where: str) -> tuple[tuple[str, str], ...]:
        """A container's `env` as (name, value) pairs; only literal values (valueFrom reads cluster objects)."""
        pairs = []
        for i, var in enumerate(self.mappings(container.get("env"), f"{where}.env")):
            at = f"{where}.env[{i}]"
            self.check_keys(var, at, {"name", "value"})
            pairs.append((self.text(var.get("name"), f"{at}.name"), self.optional_text(var, "value", at) or ""))
        return tuple(pairs)

    def number(self, value: Any, where: str) -> float:
        """An IntOrString field (`limit: "2"`, `factor: 2`)."""
        try:
            return float(str(value))
        except ValueError:
            raise self.error(f"{where} must be a number, got {value!r}") from None


_GO_DURATION = re.compile(r"([-+]?)((?:\d+(?:\.\d*)?|\.\d+)(?:ns|us|µs|ms|s|m|h))+")
_GO_UNIT = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def go_duration_s(text: str) -> float | None:
    """Seconds in a Go duration (`time.ParseDuration`: "90s", "1h30m", "500ms", "0"); None if it is not one."""
    text = text.strip()
    if text == "0":
        return 0.0
    match = _GO_DURATION.fullmatch(text)
    if match is None:
        return None
    seconds = sum(float(amount) * _UNIT_S[unit] for amount, unit in _GO_UNIT.findall(text))
    return -seconds if match.group(1) == "-" else seconds


def duration_s(value: Any, where: str, error: type[Exception]) -> float:
    """An Argo backoff duration: int seconds, "30", or a Go duration such as "5s", "1m30s", "500ms", "2h"."""
    text = str(value).strip()
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return float(text)
    seconds = go_duration_s(text)
    if seconds is None or seconds < 0:
        raise error(f"{where} must be a duration such as 30, '5s', '1m30s' or '2h', got {value!r}")
    return seconds
