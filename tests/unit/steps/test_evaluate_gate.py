"""The evaluation gate: thresholds as data, fail closed on missing or NaN metrics (RELIABILITY.md EV1)."""

import math

import pytest
from pydantic import ValidationError

from steps.evaluate import EvaluateSettings, Threshold, combine, gate, render_table, task_score


def rules(*triples):
    return [Threshold(metric=m, op=op, value=v) for m, op, v in triples]


@pytest.mark.parametrize(
    ("metrics", "thresholds", "passed"),
    [
        ({"exact_match": 0.8}, rules(("exact_match", ">=", 0.6)), True),
        ({"exact_match": 0.6}, rules(("exact_match", ">=", 0.6)), True),
        ({"exact_match": 0.6}, rules(("exact_match", ">", 0.6)), False),
        ({"eval_loss": 0.2}, rules(("eval_loss", "<=", 0.5)), True),
        (
            {"exact_match": 0.9, "exact_match_gain": 0.1},
            rules(("exact_match", ">=", 0.6), ("exact_match_gain", ">=", 0.2)),
            False,
        ),
        ({}, rules(("exact_match", ">=", 0.0)), False),
        ({"exact_match": math.nan}, rules(("exact_match", ">=", 0.0)), False),
        ({"exact_match": 1.0}, [], False),
    ],
    ids=[
        "above",
        "boundary-inclusive",
        "boundary-exclusive",
        "loss-below",
        "one-of-two-fails",
        "missing",
        "nan",
        "no-thresholds",
    ],
)
def test_gate(metrics, thresholds, passed):
    assert gate(metrics, thresholds)[0] is passed


def test_gate_reason_names_each_failing_rule():
    passed, reason = gate({"exact_match": 0.1}, rules(("exact_match", ">=", 0.6), ("contains", ">=", 0.5)))
    assert not passed
    assert "exact_match = 0.1000 fails exact_match >= 0.6" in reason
    assert "contains is missing or NaN" in reason


@pytest.mark.parametrize(
    ("metric", "answer", "reference", "score"),
    [
        ("exact_match", " 2021-03-05 ", "2021-03-05", 1.0),
        ("exact_match", "2021-03-05.", "2021-03-05", 0.0),
        ("contains", "It is 2021-03-05.", "2021-03-05", 1.0),
        ("contains", "2021-3-5", "2021-03-05", 0.0),
    ],
    ids=["exact-trimmed", "exact-extra", "contains-hit", "contains-miss"],
)
def test_task_score(metric, answer, reference, score):
    assert task_score(metric, answer, reference) == score


def test_combine_adds_base_and_gain():
    metrics = combine({"exact_match": 0.75, "eval_loss": 0.1}, {"exact_match": 0.25, "eval_loss": 2.0}, ["exact_match"])
    assert metrics == {
        "exact_match": 0.75,
        "eval_loss": 0.1,
        "base_exact_match": 0.25,
        "base_eval_loss": 2.0,
        "exact_match_gain": 0.5,
    }


def test_threshold_on_unknown_metric_is_a_config_error():
    with pytest.raises(ValidationError, match="unknown metric 'accuracy'"):
        EvaluateSettings(thresholds=(Threshold(metric="accuracy", value=0.5),))


def test_table_shows_base_tuned_and_decision():
    metrics = {
        "eval_loss": 0.1,
        "perplexity": 1.1,
        "exact_match": 0.9,
        "base_eval_loss": 2.0,
        "base_perplexity": 7.4,
        "base_exact_match": 0.1,
    }
    table = render_table(metrics, ["exact_match"], rules(("exact_match", ">=", 0.6)), True, "ok", 48)
    assert "| exact_match | 0.1000 | 0.9000 | +0.8000 |" in table
    assert "gate: PASSED" in table
