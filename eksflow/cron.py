"""Cron schedules checked as Argo checks them, so a bad one is refused at render time, not at `kubectl apply`.

Argo validates each `spec.schedules` item with robfig/cron v3's `ParseStandard` (workflow/validate/validate.go) and
its controller schedules with `cron.New()`, whose parser is the same: `Minute | Hour | Dom | Month | Dow |
Descriptor`. So a schedule is five fields (no seconds), or a descriptor (@yearly, @annually, @monthly, @weekly,
@daily, @midnight, @hourly, `@every <Go duration>`), optionally after a `TZ=<zone> ` or `CRON_TZ=<zone> ` prefix.
This module mirrors robfig/cron v3.0.1's parser.go rule for rule, quirks included (`?` means `*` in every field,
`*-5` reads as `*`), so it refuses every string Argo refuses. It refuses two more kinds, which robfig/cron would
run otherwise than written: an empty list item (`0 3 * * 1,` runs on Mondays only: the list was cut short), and an
`@every` duration that is not a whole number of seconds of at least 1s (`@every 0s`, `1ns` and `-5m` would start a
run every second; `1.5s` runs every second).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

EXAMPLE = "'0 3 * * 1' (03:00 every Monday)"
DESCRIPTORS = ("@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly")
EVERY = "@every "

# Go's unicode.IsSpace, which strings.Fields and strings.TrimSpace split on. Python's str.split() differs: it also
# splits on \x1c-\x1f, which Go keeps inside a field.
_GO_SPACE = "\t\n\v\f\r \x85\xa0\u1680" + "".join(map(chr, range(0x2000, 0x200B))) + "\u2028\u2029\u202f\u205f\u3000"
_FIELDS = re.compile(f"[^{re.escape(_GO_SPACE)}]+")
_GO_INT = re.compile(r"[+-]?[0-9]+\Z")  # strconv.Atoi: an optional sign and ASCII digits, nothing else
_INT64_MAX = (1 << 63) - 1


@dataclass(frozen=True)
class _Field:
    name: str
    low: int
    high: int
    names: tuple[str, ...] = ()  # names[i] stands for low + i, matched case-insensitively

    def allowed(self) -> str:
        named = f" or {self.names[0].upper()}-{self.names[-1].upper()}" if self.names else ""
        return f"{self.low}-{self.high}{named}"


_MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_DAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
FIELDS = (
    _Field("minute", 0, 59),
    _Field("hour", 0, 23),
    _Field("day of month", 1, 31),
    _Field("month", 1, 12, _MONTHS),
    _Field("day of week", 0, 6, _DAYS),
)


class _RefusedError(Exception):
    """One reason the parser refuses a schedule."""


def check_cron(expr: str, timezone: str = "") -> str | None:
    """The reason Argo would refuse the schedule `expr` (one line naming the field and its range), or None.

    `timezone` is the CronWorkflow's `spec.timezone`, if any: Argo prepends `CRON_TZ=<timezone> ` to the schedule,
    so a schedule with its own TZ= prefix as well would be refused by the scheduler.
    """
    try:
        _parse(expr, timezone)
    except _RefusedError as why:
        return f"cron {_short(expr)}: {why}"
    return None


def _parse(spec: str, timezone: str) -> None:
    if not spec:
        raise _RefusedError(f"the schedule is empty; e.g. {EXAMPLE}")
    if spec.startswith(("TZ=", "CRON_TZ=")):
        if timezone:
            raise _RefusedError(
                f"has its own time zone prefix and timezone {_short(timezone)} is set too (Argo prepends "
                "CRON_TZ=<timezone>, and two prefixes do not parse); keep one of them"
            )
        space, eq = spec.find(" "), spec.find("=")
        if space < 0:  # robfig/cron slices up to the first space: without one, it panics
            raise _RefusedError("a TZ=<zone> prefix must be followed by a space and the schedule")
        _check_location(spec[eq + 1 : space])
        spec = spec[space:].strip(_GO_SPACE)
    if spec.startswith("@"):
        _check_descriptor(spec)
        return
    fields = _FIELDS.findall(spec)
    if len(fields) != len(FIELDS):
        seconds = "; Argo's cron has no seconds field" if len(fields) == 6 else ""
        raise _RefusedError(
            f"expected 5 fields (minute hour day-of-month month day-of-week), found {len(fields)}{seconds}; "
            f"e.g. {EXAMPLE}"
        )
    for text, field in zip(fields, FIELDS, strict=True):
        items = text.split(",")
        if "" in items:  # robfig/cron skips it (strings.FieldsFunc): `1,` runs as `1`, a list cut short
            raise _RefusedError(
                f"{field.name} list {_short(text)} has an empty item; remove the extra comma or add the missing value"
            )
        for item in items:
            _check_range(item, field)


def _check_range(item: str, field: _Field) -> None:
    """robfig/cron's getRange: `*`, `?`, n, n-m, each with an optional /step."""
    range_and_step = item.split("/")
    low_high = range_and_step[0].split("-")
    if low_high[0] in ("*", "?"):
        start, end = field.low, field.high  # whatever follows a '-' after '*' is ignored, as in Go
    else:
        start = _number(low_high[0], field, item)
        if len(low_high) == 1:
            end = start
        elif len(low_high) == 2:
            end = _number(low_high[1], field, item)
        else:
            raise _RefusedError(f"{field.name} {_short(item)} has too many '-'; use a range like 1-5")
    if len(range_and_step) > 2:
        raise _RefusedError(f"{field.name} {_short(item)} has too many '/'; use a step like */15 or 0-30/5")
    step = 1
    if len(range_and_step) == 2:
        step = _integer(range_and_step[1], field, item, "step")
        if len(low_high) == 1:
            end = field.high  # "n/step" means "n-max/step"
    if start < field.low:
        raise _RefusedError(f"{field.name} {_at(start, item)} is below {field.low} (allowed {field.allowed()})")
    if end > field.high:
        sunday = "; Sunday is 0, and 7 is refused" if field.names == _DAYS and end == 7 else ""
        raise _RefusedError(f"{field.name} {_at(end, item)} is above {field.high} (allowed {field.allowed()}{sunday})")
    if start > end:
        raise _RefusedError(f"{field.name} range {_short(item)} starts after it ends ({start} > {end})")
    if step == 0:
        raise _RefusedError(f"{field.name} step in {_short(item)} must be a positive number, e.g. */5")


def _number(text: str, field: _Field, item: str) -> int:
    """A value or a name (JAN, mon: case-insensitive), as robfig/cron's parseIntOrName."""
    # Go's strings.ToLower also maps U+0130 (capital I with dot) to a plain 'i', where Python adds a combining dot.
    lowered = text.replace("\u0130", "i").lower()
    if lowered in field.names:
        return field.low + field.names.index(lowered)
    return _integer(text, field, item, "value")


def _integer(text: str, field: _Field, item: str, what: str) -> int:
    """strconv.Atoi followed by robfig/cron's refusal of negative numbers."""
    if not _GO_INT.match(text):
        names = " or a name" if field.names and what == "value" else ""
        raise _RefusedError(f"{field.name} {_short(text)} is not a number{names} (allowed {field.allowed()})")
    number = _bounded_int(text.lstrip("+-"), _INT64_MAX + 1) * (-1 if text.startswith("-") else 1)
    if not -_INT64_MAX - 1 <= number <= _INT64_MAX:
        raise _RefusedError(f"{field.name} {_short(text)} is out of range (allowed {field.allowed()})")
    if number < 0:
        raise _RefusedError(f"{field.name} {what} {_at(number, item)} is negative (allowed {field.allowed()})")
    return number


def _check_location(name: str) -> None:
    """time.LoadLocation: '' and UTC are UTC, Local is the machine's zone, others come from the tz database."""
    if name in ("", "UTC", "Local"):
        return
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise _RefusedError(
            f"time zone {_short(name)} is not an IANA zone name; use e.g. UTC or Europe/Paris"
        ) from None


def _check_descriptor(spec: str) -> None:
    if spec in DESCRIPTORS:
        return
    if spec.startswith(EVERY):
        duration = spec[len(EVERY) :]
        try:
            nanoseconds = go_duration(duration)
        except ValueError as why:
            raise _RefusedError(f"{why}; use a Go duration such as '@every 1h30m' (units h, m, s, ms, us, ns)") from why
        # robfig/cron's Every() runs a delay under 1s every second and drops fractions of a second: what would run
        # is not what was written (`@every -5m` and `@every 1ns` start a workflow every second), so refuse it.
        if nanoseconds < _SECOND:
            size = "not positive" if nanoseconds <= 0 else "under one second"
            raise _RefusedError(
                f"duration {_short(duration)} is {size}, and Argo's cron would start a run every second; "
                "give at least 1s, e.g. '@every 6h'"
            )
        if nanoseconds % _SECOND:
            raise _RefusedError(
                f"duration {_short(duration)} has a fraction of a second, which Argo's cron drops; "
                "give whole seconds, e.g. '@every 90s'"
            )
        return
    raise _RefusedError(
        f"unknown descriptor {_short(spec)}; use one of {', '.join(DESCRIPTORS)} or '@every <duration>' "
        "(e.g. '@every 6h'), or 5 fields such as " + EXAMPLE
    )


_UNITS = {"ns": 1, "us": 1_000, "\u00b5s": 1_000, "\u03bcs": 1_000, "ms": 1_000_000, "s": 10**9}
_UNITS |= {"m": 60 * 10**9, "h": 3600 * 10**9}
_DIGITS = frozenset("0123456789")
_SECOND = _UNITS["s"]


def go_duration(text: str) -> int:
    """Go's time.ParseDuration: `text` (number and unit, repeated: 1h30m, 1.5s) in int64 ns; ValueError if refused."""
    s = text
    if s[:1] in ("-", "+"):
        s = s[1:]
    if s == "0":
        return 0
    if not s:
        raise ValueError(f"invalid duration {_short(text)}")
    total = 0
    while s:
        if s[0] != "." and s[0] not in _DIGITS:
            raise ValueError(f"invalid duration {_short(text)}")
        i = _count_digits(s)
        whole, s = s[:i], s[i:]
        value = _bounded_int(whole, 1 << 63)
        if value > 1 << 63:
            raise ValueError(f"invalid duration {_short(text)} (too long)")
        fraction, scale, has_fraction = 0, 1.0, False
        if s.startswith("."):
            s = s[1:]
            j = _count_digits(s)
            digits, s = s[:j], s[j:]
            has_fraction = bool(digits)
            for digit in digits:  # leadingFraction: digits past int64 precision are read and ignored
                if fraction > _INT64_MAX // 10 or fraction * 10 + int(digit) > 1 << 63:
                    break
                fraction, scale = fraction * 10 + int(digit), scale * 10
        if not whole and not has_fraction:
            raise ValueError(f"invalid duration {_short(text)}")
        k = next((n for n, c in enumerate(s) if c == "." or c in _DIGITS), len(s))
        unit, s = s[:k], s[k:]
        if not unit:
            raise ValueError(f"missing unit in duration {_short(text)}")
        if unit not in _UNITS:
            raise ValueError(f"unknown unit {_short(unit)} in duration {_short(text)}")
        if value > (1 << 63) // _UNITS[unit]:
            raise ValueError(f"invalid duration {_short(text)} (too long)")
        value *= _UNITS[unit]
        if fraction > 0:
            value += int(float(fraction) * (float(_UNITS[unit]) / scale))  # float64 arithmetic, as in Go
        total += value
        if value > 1 << 63 or total > 1 << 63:
            raise ValueError(f"invalid duration {_short(text)} (too long)")
    if not text.startswith("-") and total > _INT64_MAX:
        raise ValueError(f"invalid duration {_short(text)} (too long)")
    return -total if text.startswith("-") else total


def _short(text: str) -> str:
    """`text` quoted for a one-line message, cut to 60 characters (a schedule may be pasted garbage)."""
    return repr(text) if len(text) <= 60 else repr(text[:57]) + "..."


def _at(value: int, item: str) -> str:
    """`25`, or `25 in '20-25'` when the item says more than the value."""
    return str(value) if item == str(value) else f"{value} in {_short(item)}"


def _bounded_int(digits: str, bound: int) -> int:
    """ASCII digits as an int, or bound + 1 when larger than `bound` (without converting thousands of digits)."""
    digits = digits.lstrip("0")
    if len(digits) > len(str(bound)):
        return bound + 1
    return int(digits or "0")


def _count_digits(s: str) -> int:
    return next((n for n, c in enumerate(s) if c not in _DIGITS), len(s))
