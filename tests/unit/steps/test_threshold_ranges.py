"""A gate no model can pass is refused when the config is read: each metric's range bounds what a threshold asks."""

import pytest
from pydantic import ValidationError

from eksflow.llm.steps.common.gate import Threshold
from eksflow.llm.steps.evaluate import EvaluateSettings

TASK_METRICS = ("exact_match", "rouge_l")


def settings(metric: str, op: str, value: float) -> EvaluateSettings:
    return EvaluateSettings(task_metrics=TASK_METRICS, thresholds=(Threshold(metric=metric, op=op, value=value),))


@pytest.mark.parametrize(
    ("metric", "op", "value", "range_said"),
    [
        ("exact_match", ">=", 1.5, "from 0 to 1"),
        ("rouge_l", ">", 1.0, "from 0 to 1"),
        ("base_exact_match", "<", 0.0, "from 0 to 1"),
        ("exact_match_gain", ">=", 1.2, "from -1 to 1"),
        ("exact_match_gain", "<", -1.0, "from -1 to 1"),
        ("perplexity", "<", 1.0, "at least 1"),
        ("eval_loss", "<", 0.0, "at least 0"),
    ],
)
def test_a_threshold_no_metric_value_can_meet_is_refused_naming_the_range(metric, op, value, range_said):
    with pytest.raises(ValidationError, match=f"{metric} {op} {value:g} can never hold: {metric} is {range_said}"):
        settings(metric, op, value)


@pytest.mark.parametrize(
    ("metric", "op", "value"),
    [
        ("exact_match", ">=", 1.0),
        ("exact_match", "<=", 0.0),
        ("exact_match_gain", ">=", -0.5),
        ("exact_match_gain", ">", 0.99),
        ("perplexity", "<=", 1.0),
        ("eval_loss", "<=", 0.0),
        ("eval_loss", "<=", 100.0),
    ],
)
def test_a_threshold_some_value_meets_is_kept(metric, op, value):
    assert settings(metric, op, value).thresholds[0].value == value
