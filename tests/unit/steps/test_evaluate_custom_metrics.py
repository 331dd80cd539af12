"""A config names a custom task metric; only a function its module declared with @task_metric is ever accepted.

The config is text anyone who submits a run may write. Before this rule, `evaluate.task_metrics` imported any
callable: `shutil:copyfile` overwrote a file named by the model's answer, `os:system` ran it as a shell command.
"""

from __future__ import annotations

import itertools
import textwrap

import pytest
from pydantic import ValidationError

from eksflow.runtime import task_metric
from steps.evaluate import EvaluateSettings
from steps.evaluate.metrics import resolve, score
from steps.evaluate.step import main

_FRESH = itertools.count()

USER_METRICS = """
    import os
    import pathlib

    from eksflow.runtime import task_metric

    THRESHOLD = 0.5
    CALLED = pathlib.Path(os.environ["METRIC_MARKER"])


    @task_metric
    def starts_alike(answer: str, reference: str) -> float:
        CALLED.write_text("called")  # validation must never call a metric
        return float(answer[:3] == reference[:3])


    def undecorated(answer: str, reference: str) -> float:
        return 1.0


    class Scorer:
        def __call__(self, answer: str, reference: str) -> float:
            return 1.0


    @task_metric
    def one_argument(answer: str) -> float:
        return 1.0


    @task_metric
    def three_arguments(answer: str, reference: str, weight: float) -> float:
        return 1.0


    @task_metric
    async def awaited(answer: str, reference: str) -> float:
        return 1.0


    @task_metric
    def rebound(answer: str, reference: str) -> float:
        return 1.0


    rebound = os.system  # the declared name now holds something else


    def __getattr__(name):  # a module __getattr__ is code: validation must not reach it
        if name.startswith("__"):
            raise AttributeError(name)  # the import system asks for __path__ and the like
        CALLED.write_text(f"__getattr__ {name}")
        return undecorated
"""


@pytest.fixture
def user_package(tmp_path, monkeypatch):
    """A fresh importable package (a new name per test: imports are cached) holding the user's modules."""
    name = f"user_metrics_{next(_FRESH)}"
    package = tmp_path / "src" / name
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "mine.py").write_text(textwrap.dedent(USER_METRICS))
    (package / "broken.py").write_text("raise RuntimeError('the top level failed')\n")
    (package / "reexport.py").write_text(f"from {name}.mine import starts_alike\n")
    monkeypatch.syspath_prepend(str(tmp_path / "src"))
    monkeypatch.setenv("METRIC_MARKER", str(tmp_path / "called"))
    return name


def test_a_declared_metric_is_accepted_without_being_called_and_then_scores(user_package, tmp_path):
    name = f"{user_package}.mine:starts_alike"
    settings = EvaluateSettings(task_metrics=("exact_match", name))
    assert settings.task_metrics == ("exact_match", name)
    assert not (tmp_path / "called").exists()  # neither the metric nor the module's __getattr__ ran
    assert score(resolve(name), ["abcd", "xyz"], ["abcz", "abc"]) == 0.5


@pytest.mark.parametrize(
    ("metric", "refusal"),
    [
        ("os:system", "is in the standard library"),
        ("builtins:eval", "is in the standard library"),
        ("shutil:copyfile", "is in the standard library"),
        ("subprocess:getoutput", "is in the standard library"),
        ("antigravity:fly", "is in the standard library"),  # refused before its import opens a browser
        ("{pkg}.mine:Scorer", "is not declared a metric by {pkg}.mine"),
        ("{pkg}.mine:THRESHOLD", "is not declared a metric by {pkg}.mine"),
        ("{pkg}.mine:undecorated", "is not declared a metric by {pkg}.mine"),
        ("{pkg}.mine:no_such_name", "is not declared a metric by {pkg}.mine"),
        ("{pkg}.mine:rebound", "is not declared a metric by {pkg}.mine"),
        ("{pkg}.reexport:starts_alike", "is not declared a metric by {pkg}.reexport"),
        ("{pkg}.mine:one_argument", "cannot be called as one_argument(answer, reference)"),
        ("{pkg}.mine:three_arguments", "cannot be called as three_arguments(answer, reference)"),
        ("{pkg}.mine:awaited", "is a coroutine or generator function"),
        ("{pkg}.broken:metric", "importing {pkg}.broken failed: RuntimeError: the top level failed"),
        ("{pkg}.missing:metric", "no module '{pkg}.missing' on the path"),
        ("no_such_package_here:metric", "no module 'no_such_package_here' on the path"),
        ("../x:y", "unknown task metric '../x:y'"),
        ("os.path:join", "is in the standard library"),
        ("bleu", "unknown task metric 'bleu'"),
    ],
    ids=lambda value: value.replace("{pkg}", "user"),
)
def test_anything_but_a_declared_metric_is_refused_naming_the_field(user_package, tmp_path, metric, refusal):
    metric, refusal = metric.format(pkg=user_package), refusal.format(pkg=user_package)
    with pytest.raises(ValidationError) as caught:
        EvaluateSettings(task_metrics=("exact_match", metric), thresholds=())
    (error,) = caught.value.errors()
    assert error["loc"] == ("task_metrics",)
    assert refusal in error["msg"], error["msg"]
    assert not (tmp_path / "called").exists()


def test_the_step_refuses_an_undeclared_metric_with_exit_2_before_any_work(tmp_path, capsys):
    target = tmp_path / "target.txt"
    target.write_text("kept")
    code = main(
        [
            f"--dataset-dir={tmp_path}",
            f"--adapter-dir={tmp_path}",
            "--base-model=smollm2-135m-instruct",
            f"--report-dir={tmp_path / 'reports'}",
            f"--outputs-dir={tmp_path / 'outputs'}",
            '--task-metrics=["exact_match", "shutil:copyfile"]',
        ]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --task-metrics: ") and "'shutil:copyfile' is in the standard library" in err
    assert "@eksflow.runtime.task_metric" in err and len(err.strip().splitlines()) == 1
    assert target.read_text() == "kept" and not (tmp_path / "outputs").exists()


def test_the_decorator_takes_only_top_level_functions():
    with pytest.raises(TypeError, match="top level of a module"):
        task_metric(type("Scorer", (), {}))  # type: ignore[type-var]

    def outer() -> None:
        @task_metric
        def nested(answer: str, reference: str) -> float:
            return 1.0

    with pytest.raises(TypeError, match="top level of a module"):
        outer()


def test_a_metric_returning_a_non_number_is_refused():
    with pytest.raises(ValueError, match="returned 'yes'; it must return a float"):
        score(lambda answer, reference: "yes", ["a"], ["a"])  # type: ignore[arg-type, return-value]


def test_built_in_metrics_need_no_declaration():
    names = ("exact_match", "contains", "json_match", "rouge_l")
    assert EvaluateSettings(task_metrics=names).task_metrics == names
