"""Choosing a sweep's winner: the best that passed the gate, by the champion metric, ties to the earlier item."""

import json

import pytest

from eksflow.llm.steps.select_best import Args, best, main


@pytest.mark.parametrize(
    ("passed", "scores", "metric", "expected"),
    [
        ([True, True], [0.5, 0.9], "exact_match", 1),
        ([True, False], [0.5, 0.9], "exact_match", 0),  # the better one failed the gate
        ([False, False], [0.5, 0.9], "exact_match", None),
        ([True, True], [0.7, 0.7], "exact_match", 0),  # a tie goes to the earlier item
        ([True, True], [0.4, 0.2], "eval_loss", 1),  # lower is better
        ([True, True], [float("nan"), 0.1], "exact_match", 1),  # NaN never wins
    ],
)
def test_best_passing_candidate(passed, scores, metric, expected):
    metrics = [{metric: s} for s in scores]
    assert best(["a", "b"], passed, metrics, metric) == expected


def test_collected_outputs_arrive_as_json_text_per_item(tmp_path):
    argv = [
        '--names=["r8","r16"]',
        '--passed=["true","true"]',
        '--metrics=["{\\"exact_match\\": 0.5}","{\\"exact_match\\": 0.75}"]',
        '--adapter-dirs=["/a","/b"]',
        '--mlflow-run-ids=["1","2"]',
        '--reports=["/r1","/r2"]',
        f"--outputs-dir={tmp_path}",
    ]
    assert main(argv) == 0
    assert (tmp_path / "name").read_text() == "r16"
    assert json.loads((tmp_path / "metrics").read_text()) == {"exact_match": 0.75}
    assert (tmp_path / "reason").read_text().startswith("r16 is best by exact_match: r8 0.5000, r16 0.7500")


def test_lists_of_different_lengths_are_bad_input(tmp_path):
    with pytest.raises(ValueError, match="passed has 1 entries for 2 candidates"):
        Args(
            names=["a", "b"],
            passed=[True],
            metrics=[{}, {}],
            adapter_dirs=["", ""],
            mlflow_run_ids=["", ""],
            reports=["", ""],
        )
