import pytest

from eksflow.local.expressions import (
    ExpressionError,
    TaskOutcome,
    dependencies_to_depends,
    depends_on_failure,
    depends_references,
    evaluate_depends,
    evaluate_retry_expression,
    evaluate_when,
)
from eksflow.local.phase import Phase

WHEN_CASES = [
    ("true == true", True),
    ("false == true", False),
    ("true", True),
    ("!false", True),
    ("!(true == true)", False),
    ("Succeeded == Succeeded", True),
    ("Failed != Succeeded", True),
    ("'a b' == \"a b\"", True),
    ("'it\\'s' == \"it's\"", True),
    ("0.81 >= 0.7", True),
    ("0.69 >= 0.7", False),
    ("10 > 9", True),  # numeric, not lexicographic
    ("-1 < 0", True),
    ("1 == 1.0", True),
    ("1 == '1'", False),  # govaluate: a number never equals a string
    ("b > a", True),
    ("true && false || true", True),
    ("true && (false || false)", False),
    ("5 > 3 && heads == heads", True),
    ("s3://bucket/x == s3://bucket/x", True),
    ("my-value == my-value", True),
]


@pytest.mark.parametrize(("expression", "expected"), WHEN_CASES, ids=[c[0] for c in WHEN_CASES])
def test_when(expression: str, expected: bool) -> None:
    assert evaluate_when(expression) is expected


WHEN_ERRORS = [
    ("", "empty"),
    ("true ==", "expected a value"),
    ("(true", "missing"),
    ("true true", "unexpected"),
    ("heads", "expected true or false"),
    ("1 && true", "needs true/false"),
    ("1 < a", "cannot compare"),
    ("f(1) == 1", "unknown function"),
]


@pytest.mark.parametrize(("expression", "message"), WHEN_ERRORS, ids=[c[0] or "empty" for c in WHEN_ERRORS])
def test_when_errors(expression: str, message: str) -> None:
    with pytest.raises(ExpressionError, match=message):
        evaluate_when(expression)


S, F = Phase.SUCCEEDED, Phase.FAILED
OUTCOMES = {
    "a": TaskOutcome(S),
    "b": TaskOutcome(F),
    "c": TaskOutcome(Phase.SKIPPED),
    "d": TaskOutcome(Phase.OMITTED),
    "e": TaskOutcome(Phase.ERROR),
    "some": TaskOutcome(F, (S, F)),  # a fan-out with one iteration failed
    "none": TaskOutcome(F, (F, F)),
}
DEPENDS_CASES = [
    ("a", True),
    ("c", True),  # bare = Succeeded || Skipped || Daemoned
    ("b", False),
    ("d", False),
    ("e", False),
    ("a.Succeeded", True),
    ("b.Failed", True),
    ("e.Errored", True),
    ("e.Failed", False),
    ("c.Skipped", True),
    ("d.Omitted", True),
    ("a.Daemoned", False),
    ("a.AnySucceeded", False),  # only a fan-out has iterations (Argo: false for a task that did not fan out)
    ("b.AllFailed", False),
    ("some", False),
    ("some.AnySucceeded", True),
    ("some.AllFailed", False),
    ("none.AnySucceeded", False),
    ("none.AllFailed", True),
    ("a && (b.Succeeded || b.Failed)", True),
    ("a && b", False),
    ("!b", True),
    ("(b || d) || c.Skipped", True),
]


@pytest.mark.parametrize(("expression", "expected"), DEPENDS_CASES, ids=[c[0] for c in DEPENDS_CASES])
def test_depends(expression: str, expected: bool) -> None:
    assert evaluate_depends(expression, OUTCOMES) is expected


def test_depends_references_and_failure_handling() -> None:
    expression = "stage-data && (train.Failed || evaluate.Errored) && !x.AllFailed && y.AnySucceeded"
    assert depends_references(expression) == [
        ("stage-data", None),
        ("train", "Failed"),
        ("evaluate", "Errored"),
        ("x", "AllFailed"),
        ("y", "AnySucceeded"),
    ]
    assert depends_on_failure(expression) == {"train", "evaluate", "x", "y"}
    assert dependencies_to_depends(["a", "b"]) == "a && b"


@pytest.mark.parametrize(
    ("expression", "message"),
    [("a.Finished", "unknown result"), ("zz", "has not completed"), ("a &&", "expected a value")],
    ids=["bad-result", "unknown-task", "truncated"],
)
def test_depends_errors(expression: str, message: str) -> None:
    with pytest.raises(ExpressionError, match=message):
        evaluate_depends(expression, OUTCOMES)


RETRY_CASES = [
    ("asInt(lastRetry.exitCode) != 2", "1", True),
    ("asInt(lastRetry.exitCode) != 2", "2", False),
    ('asInt(lastRetry.exitCode) > 1 && lastRetry.status != "Error"', "3", True),
    ("asInt(lastRetry.exitCode) == 137 or lastRetry.message matches 'imminent node shutdown|pod deleted'", "1", True),
    ("not (asFloat(lastRetry.duration) < 120)", "1", False),
    ("lastRetry.status == 'Failed' and asInt(lastRetry.exitCode) != 2", "143", True),
]


@pytest.mark.parametrize(
    ("expression", "exit_code", "expected"), RETRY_CASES, ids=[f"{c[0]}|{c[1]}" for c in RETRY_CASES]
)
def test_retry_expression(expression: str, exit_code: str, expected: bool) -> None:
    variables = {
        "lastRetry.exitCode": exit_code,
        "lastRetry.status": "Failed",
        "lastRetry.duration": "12",
        "lastRetry.message": "pod deleted",
    }
    assert evaluate_retry_expression(expression, variables) is expected


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("asInt(lastRetry.nope) != 2", "unknown variable"),
        ("asInt(lastRetry.message) != 2", "not an integer"),
        ("asInt(lastRetry.exitCode)", "expected true or false"),
    ],
    ids=["unknown-variable", "not-an-int", "not-boolean"],
)
def test_retry_expression_errors(expression: str, message: str) -> None:
    with pytest.raises(ExpressionError, match=message):
        evaluate_retry_expression(expression, {"lastRetry.exitCode": "1", "lastRetry.message": "boom"})
