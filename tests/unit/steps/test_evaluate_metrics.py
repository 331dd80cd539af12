"""Task metrics fit any task: built-ins, NaN rows left out, bad names refused (custom: test_evaluate_custom_metrics)."""

import math

import pytest

from eksflow.llm.steps.evaluate import EvaluateSettings
from eksflow.llm.steps.evaluate.metrics import BUILT_IN, resolve, score


@pytest.mark.parametrize(
    ("metric", "answer", "reference", "expected"),
    [
        ("exact_match", " 2021-03-05 ", "2021-03-05", 1.0),
        ("exact_match", "2021-03-05.", "2021-03-05", 0.0),
        ("contains", "It is 2021-03-05.", "2021-03-05", 1.0),
        ("contains", "2021-3-5", "2021-03-05", 0.0),
        ("json_match", '{"b": 2,  "a": [1, "x"]}', '{"a": [1, "x"], "b": 2}', 1.0),
        ("json_match", '```json\n{"a": 1}\n```', '{"a": 1}', 1.0),
        ("json_match", '{"a": 1, "b": 2}', '{"a": 1}', 0.0),
        ("json_match", "not json", '{"a": 1}', 0.0),
        ("rouge_l", "the cat sat on the mat", "the cat sat on the mat", 1.0),
        ("rouge_l", "the cat sat", "the cat sat on the mat", 2 * 1.0 * 0.5 / 1.5),
        ("rouge_l", "dog", "the cat", 0.0),
    ],
    ids=[
        "exact",
        "exact-extra",
        "contains",
        "contains-miss",
        "json-reordered",
        "json-fenced",
        "json-extra-key",
        "json-not-json",
        "rouge-same",
        "rouge-half",
        "rouge-none",
    ],
)
def test_built_in_metrics(metric, answer, reference, expected):
    assert BUILT_IN[metric](answer, reference) == pytest.approx(expected)


def test_rows_a_metric_cannot_score_are_left_out_and_none_scored_is_nan():
    assert score(BUILT_IN["json_match"], ['{"a": 1}', "x"], ['{"a": 1}', "plain text"]) == 1.0
    assert math.isnan(score(BUILT_IN["json_match"], ["x"], ["plain text"]))


def test_metric_names_are_checked_in_config_and_imports_in_the_step():
    with pytest.raises(ValueError, match="unknown task metric 'bleu'"):
        EvaluateSettings(task_metrics=("bleu",))
    with pytest.raises(ValueError, match="no_such_module_here is not in this project's packages"):
        resolve("no_such_module_here:metric")


def test_a_metric_outside_zero_one_is_refused():
    with pytest.raises(ValueError, match="must be in"):
        score(lambda a, r: 2.0, ["a"], ["b"])
