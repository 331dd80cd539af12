"""eksflow.cron refuses what Argo's parser (robfig/cron v3 ParseStandard) refuses, and what it would run otherwise
than written (an empty list item, an `@every` under a second or with a fraction of one); it accepts the rest."""

import pytest

from eksflow.cron import check_cron, go_duration

ACCEPTED = [
    ("0 3 * * 1", "weekly"),
    ("* * * * *", "every-minute"),
    ("0 0 1 1 *", "yearly-fields"),
    ("59 23 31 12 6", "upper-bounds"),
    ("0 0 1 1 0", "lower-bounds"),
    ("*/15 * * * *", "star-step"),
    ("0-30/5 * * * *", "range-step"),
    ("5/10 * * * *", "start-step"),
    ("0,15,30,45 * * * *", "list"),
    ("0 9-17 * * MON-FRI", "day-names"),
    ("0 3 * jan-dec sun", "lowercase-names"),
    ("0 3 * Jan,Jul *", "month-name-list"),
    ("0 3 ? * *", "question-mark"),
    ("? ? ? ? ?", "question-everywhere"),
    ("*/100 * * * *", "step-past-max"),
    ("*/+2 * * * *", "plus-sign-step"),
    ("007 03 * * *", "leading-zeros"),
    ("*-5 * * * *", "star-dash-quirk"),
    ("0\t3  *\n* *", "any-whitespace"),
    ("  0 3 * * 1  ", "surrounding-spaces"),
    ("@yearly", "yearly"),
    ("@annually", "annually"),
    ("@monthly", "monthly"),
    ("@weekly", "weekly-descriptor"),
    ("@daily", "daily"),
    ("@midnight", "midnight"),
    ("@hourly", "hourly"),
    ("@every 1h30m", "every"),
    ("@every 1.5h", "every-fraction"),
    ("@every 90s", "every-seconds"),
    ("@every 1s", "every-second"),
    ("@every 2000ms", "every-whole-seconds-in-ms"),
    ("TZ=Europe/Paris 0 3 * * *", "tz-prefix"),
    ("CRON_TZ=UTC @daily", "cron-tz-descriptor"),
    ("CRON_TZ=America/New_York   0 3 * * *", "cron-tz-spaces"),
]


@pytest.mark.parametrize("expr", [e for e, _ in ACCEPTED], ids=[i for _, i in ACCEPTED])
def test_argo_accepts(expr):
    assert check_cron(expr) is None


REFUSED = [
    # the seven schedules of the issue, each naming its field and range
    ("60 3 * * 1", "minute 60 is above 59 (allowed 0-59)"),
    ("0 25 * * *", "hour 25 is above 23 (allowed 0-23)"),
    ("0 3 * * 8", "day of week 8 is above 6 (allowed 0-6 or SUN-SAT)"),
    ("0 3 1 13 *", "month 13 is above 12 (allowed 1-12 or JAN-DEC)"),
    ("0 3 0 * *", "day of month 0 is below 1 (allowed 1-31)"),
    ("*/0 3 * * *", "minute step in '*/0' must be a positive number"),
    ("@nonsense", "unknown descriptor '@nonsense'"),
    # robfig/cron's dow is 0-6: 7 is not Sunday
    ("0 3 * * 7", "Sunday is 0, and 7 is refused"),
    ("0 3 * * 1-7", "day of week 7 in '1-7' is above 6"),
    ("0 3 32 * *", "day of month 32 is above 31"),
    ("0 3 * 0 *", "month 0 is below 1"),
    ("0 20-25 * * *", "hour 25 in '20-25' is above 23"),
    ("5-1 * * * *", "minute range '5-1' starts after it ends (5 > 1)"),
    ("0-10/0 * * * *", "minute step in '0-10/0' must be a positive number"),
    ("*/-1 * * * *", "minute step -1 in '*/-1' is negative"),
    ("-1 * * * *", "minute '' is not a number"),
    ("1-2-3 * * * *", "too many '-'"),
    ("*/2/3 * * * *", "too many '/'"),
    ("x * * * *", "minute 'x' is not a number"),
    ("0 3 * * MON/2/1", "too many '/'"),
    ("0 3 * * funday", "day of week 'funday' is not a number or a name"),
    ("0 3 * JANUARY *", "month 'JANUARY' is not a number or a name"),
    ("*/MON * * * *", "minute 'MON' is not a number"),
    ("1_0 * * * *", "minute '1_0' is not a number"),
    ("\u0661 * * * *", "is not a number"),  # ARABIC-INDIC DIGIT ONE: Go's Atoi takes ASCII digits only
    ("99999999999999999999 * * * *", "is out of range"),
    ("0 3 * *", "expected 5 fields (minute hour day-of-month month day-of-week), found 4"),
    ("0 0 3 * * 1", "found 6; Argo's cron has no seconds field"),
    ("", "the schedule is empty"),
    ("   ", "found 0"),
    ("0\x1c3 * * * *", "is not a number"),  # a separator Python splits on and Go does not: one odd field
    (" @daily", "found 1"),  # a descriptor must start the schedule
    ("@daily ", "unknown descriptor"),
    ("@every", "unknown descriptor"),
    ("@every ", "invalid duration ''"),
    ("@every 1x", "unknown unit 'x'"),
    ("@every 10", "missing unit in duration '10'"),
    ("@every 1d", "unknown unit 'd'"),
    ("@every  1h", "invalid duration ' 1h'"),
    ("@every .h", "invalid duration '.h'"),
    ("@every 9999999999h", "too long"),
    # robfig/cron runs these otherwise than written: refused
    ("0 3 * * 1,", "day of week list '1,' has an empty item; remove the extra comma or add the missing value"),
    ("1,,2 * * * *", "minute list '1,,2' has an empty item"),
    (",5 * * * *", "minute list ',5' has an empty item"),
    ("0 3 , * *", "day of month list ',' has an empty item"),
    ("@every 0s", "duration '0s' is not positive, and Argo's cron would start a run every second"),
    ("@every 0", "duration '0' is not positive"),
    ("@every -5m", "duration '-5m' is not positive"),
    ("@every 1ns", "duration '1ns' is under one second"),
    ("@every 500ms", "duration '500ms' is under one second"),
    ("@every 1.5s", "duration '1.5s' has a fraction of a second, which Argo's cron drops"),
    ("@every 90001ms", "has a fraction of a second"),
    ("TZ=Nowhere/City 0 3 * * *", "time zone 'Nowhere/City' is not an IANA zone name"),
    ("CRON_TZ=UTC", "must be followed by a space"),
    ("TZ=../etc/passwd 0 3 * * *", "is not an IANA zone name"),
]


@pytest.mark.parametrize(("expr", "reason"), REFUSED, ids=[repr(e) for e, _ in REFUSED])
def test_argo_refuses_with_one_line_naming_the_field(expr, reason):
    problem = check_cron(expr)
    assert problem is not None
    assert reason in problem
    assert problem.startswith(f"cron {expr!r}: ")
    assert "\n" not in problem


def test_a_prefix_and_a_timezone_together_are_refused():
    # Argo prepends CRON_TZ=<spec.timezone> to the schedule; a second prefix then fails in the scheduler
    assert "keep one of them" in (check_cron("TZ=UTC 0 3 * * *", timezone="Europe/Paris") or "")
    assert check_cron("0 3 * * *", timezone="Europe/Paris") is None


def test_a_huge_schedule_is_refused_quickly_and_quoted_short():
    problem = check_cron("1" * 100_000 + " * * * *")
    assert problem is not None and "out of range" in problem and len(problem) < 300


@pytest.mark.parametrize(
    ("text", "nanoseconds"),
    [
        ("1h30m", 5400 * 10**9),
        ("-1h", -3600 * 10**9),
        ("+5m", 300 * 10**9),
        ("1.5h", 5400 * 10**9),
        ("1.h", 3600 * 10**9),
        (".5s", 5 * 10**8),
        ("300ms", 3 * 10**8),
        ("1us", 1_000),
        ("1µs", 1_000),  # U+00B5 micro sign
        ("1μs", 1_000),  # U+03BC Greek mu
        ("2562047h", 2562047 * 3600 * 10**9),  # just under int64 nanoseconds
        ("2562048h", None),
        ("9223372036854775807ns", 9223372036854775807),
        ("9223372036854775808ns", None),
        ("-9223372036854775808ns", -9223372036854775808),
        ("0", 0),
        ("", None),
        ("-", None),
        ("1", None),
        ("h", None),
        ("1H", None),
        ("1h ", None),
    ],
)
def test_go_durations(text, nanoseconds):
    if nanoseconds is None:
        with pytest.raises(ValueError, match="duration"):
            go_duration(text)
    else:
        assert go_duration(text) == nanoseconds
