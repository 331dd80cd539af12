"""The evaluation gate: thresholds as data, fail closed on missing or NaN metrics (docs/reliability.md EV1)."""

import hashlib
import math

import pytest
from pydantic import ValidationError

from eksflow.llm.steps.common.gate import Threshold, Verdict, gate
from eksflow.llm.steps.evaluate import EvaluateSettings
from eksflow.llm.steps.evaluate.gate import Champion, champion_gate, combine, distinct_prefixes
from eksflow.llm.steps.evaluate.report import render_table
from eksflow.llm.steps.evaluate.step import eval_set_digest


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
    assert gate(metrics, thresholds).passed is passed


def test_gate_reason_names_each_failing_rule():
    verdict = gate({"exact_match": 0.1}, rules(("exact_match", ">=", 0.6), ("contains", ">=", 0.5)))
    assert not verdict.passed
    assert "exact_match = 0.1000 fails exact_match >= 0.6" in verdict.reason
    assert "contains is missing or NaN" in verdict.reason
    assert [(r.rule.metric, r.ok) for r in verdict.results] == [("exact_match", False), ("contains", False)]
    assert math.isnan(verdict.results[1].value) and verdict.results[1].report()["actual"] is None


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
    table = render_table(metrics, ["exact_match"], gate(metrics, rules(("exact_match", ">=", 0.6))), 48)
    assert "| exact_match | 0.1000 | 0.9000 | +0.8000 |" in table
    assert "| exact_match >= 0.6 | 0.9000 | pass |" in table
    assert "gate: PASSED" in table


def champion(score=0.7, digest="sha256:aa", version="3", metric="exact_match"):
    return Champion(version=version, eval_set_digest=digest, scores={metric: score})


@pytest.mark.parametrize(
    ("metrics", "found", "margin", "applied", "passed"),
    [
        ({"exact_match": 0.9}, None, 0.05, False, True),
        ({"exact_match": 0.80}, champion(0.7), 0.05, True, True),
        ({"exact_match": 0.75}, champion(0.7), 0.05, True, True),
        ({"exact_match": 0.74}, champion(0.7), 0.05, True, False),
        ({"exact_match": 0.1}, champion(0.7, digest="sha256:bb"), 0.05, False, True),
        ({"exact_match": 0.1}, champion(0.7, digest=""), 0.05, False, True),
        ({"exact_match": 0.1}, champion(0.7, metric="contains"), 0.05, False, True),
        ({}, champion(0.7), 0.0, True, False),
        ({"exact_match": math.nan}, champion(0.7), 0.0, True, False),
    ],
    ids=[
        "no-champion",
        "beats",
        "exactly-margin",
        "short-of-margin",
        "other-eval-set",
        "champion-without-digest",
        "champion-without-score",
        "missing",
        "nan",
    ],
)
def test_champion_gate(metrics, found, margin, applied, passed):
    check = champion_gate(metrics, found, "sha256:aa", "exact_match", margin)
    assert (check.applied, check.passed) == (applied, passed)


@pytest.mark.parametrize(("metric", "score"), [("exact_match", 1.0), ("eval_loss", 0.5)])
def test_a_tie_with_the_champion_is_not_a_win(metric, score):
    """v1 re-scored 1.0 against champion v2's 1.0 under champion_margin 0 must not be registered over it."""
    found = champion(score, version="2", metric=metric)
    check = champion_gate({metric: score}, found, "sha256:aa", metric, 0.0)
    assert check.applied and not check.passed
    assert check.reason.startswith("does not beat champion v2")
    better = score + 0.01 if metric == "exact_match" else score - 0.01
    assert champion_gate({metric: better}, found, "sha256:aa", metric, 0.0).passed  # any improvement wins


def test_champion_gate_on_loss_wants_lower():
    found = Champion(version="2", eval_set_digest="d", scores={"eval_loss": 0.5})
    assert champion_gate({"eval_loss": 0.4}, found, "d", "eval_loss", 0.1).passed
    check = champion_gate({"eval_loss": 0.45}, found, "d", "eval_loss", 0.1)
    assert not check.passed
    assert check.required == pytest.approx(0.4)


def test_champion_on_another_eval_set_is_named_in_the_reason():
    check = champion_gate(
        {"exact_match": 0.9}, champion(digest="sha256:" + "b" * 64), "sha256:" + "a" * 64, "exact_match", 0
    )
    assert "champion v3 was scored on eval set bbbbbbbbbbbb, this run on aaaaaaaaaaaa" in check.reason
    assert "not comparable, thresholds only" in check.reason


def test_two_eval_set_digests_in_a_message_never_read_the_same():
    first, second = "sha256:" + "ab" * 10 + "1" * 44, "sha256:" + "ab" * 10 + "2" * 44
    assert distinct_prefixes(first, second) == ("ab" * 10 + "1111", "ab" * 10 + "2222")
    assert distinct_prefixes("sha256:" + "a" * 64, "") == ("a" * 12, "")


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")], ids=str)
def test_a_threshold_or_margin_that_is_no_finite_number_is_refused(value):
    with pytest.raises(ValidationError, match="finite number"):
        Threshold(metric="exact_match", value=value)
    with pytest.raises(ValidationError, match=r"finite number|greater than or equal"):
        EvaluateSettings(champion_margin=value)


def test_eval_set_digest_is_the_file_sha256_and_marks_subsets(tmp_path):
    path = tmp_path / "eval.jsonl"
    path.write_bytes(b'{"prompt": "p", "completion": "c"}\n')
    full = eval_set_digest(path, 0)
    assert full == "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()
    assert eval_set_digest(path, 8) == full + "@first-8"


def test_champion_metric_must_be_a_tuned_metric():
    with pytest.raises(ValidationError, match="champion_metric 'exact_match_gain' is not a tuned metric"):
        EvaluateSettings(champion_metric="exact_match_gain")


def test_table_shows_the_champion_rule():
    check = champion_gate({"exact_match": 0.74}, champion(0.7), "sha256:aa", "exact_match", 0.05)
    table = render_table({"exact_match": 0.74}, ["exact_match"], Verdict(False, check.reason), 8, check)
    assert "| exact_match >= 0.75 (champion v3) | 0.7400 | FAIL |" in table
