"""A config names a custom task metric; only a function its module declared with @task_metric is ever accepted.

The config is text anyone who submits a run may write. Before this rule, `evaluate.task_metrics` imported any
callable: `shutil:copyfile` overwrote a file named by the model's answer, `os:system` ran it as a shell command.
Then checking a name imported whatever module it named: `mlflow.__main__:x` ran MLflow's command line while
`render` checked the config. Only a module of the project's own packages, found on the file system, is imported.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest
from pydantic import ValidationError

from eksflow.llm.steps.common.gate import Threshold, gate
from eksflow.llm.steps.evaluate import EvaluateSettings
from eksflow.llm.steps.evaluate.gate import combine
from eksflow.llm.steps.evaluate.metrics import resolve, score
from eksflow.llm.steps.evaluate.step import main
from eksflow.runtime import metrics as runtime_metrics
from eksflow.runtime import task_metric

ROOT = Path(__file__).resolve().parents[3]
CANARY = """
import os
import pathlib

print("imported: code named by a config ran")
pathlib.Path(os.environ["METRIC_CANARY"]).write_text("imported")
"""

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


OTHER_METRICS = """
    from eksflow.runtime import task_metric


    @task_metric
    def starts_alike(answer: str, reference: str) -> float:  # the short name of mine.starts_alike too
        return float(answer[:1] == reference[:1])
"""


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))


@pytest.fixture
def user_package(tmp_path, monkeypatch):
    """A fresh package (a new name per test: imports are cached) of a project in tmp_path: the user's modules.

    The project is the pipeline's: eksflow.runtime.metrics takes it as the CLI does (`use_project`).
    """
    name = f"user_metrics_{uuid.uuid4().hex}"  # unique across this module's copies (another test imports it)
    project = tmp_path / "project"
    write(project / name / "__init__.py", "")
    write(project / name / "mine.py", USER_METRICS)
    write(project / name / "broken.py", "raise RuntimeError('the top level failed')\n")
    write(project / name / "reexport.py", f"from {name}.mine import starts_alike\n")
    write(project / name / "other.py", OTHER_METRICS)
    monkeypatch.syspath_prepend(str(project))
    monkeypatch.setattr(runtime_metrics, "_project", project)
    monkeypatch.setenv("METRIC_MARKER", str(tmp_path / "called"))
    monkeypatch.setenv("METRIC_CANARY", str(tmp_path / "canary"))
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
        ("{pkg}.missing:metric", "{pkg}.missing is not in this project's packages"),
        ("no_such_package_here:metric", "no_such_package_here is not in this project's packages"),
        ("{pkg}..mine:starts_alike", "unknown task metric '{pkg}..mine:starts_alike'"),
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
            "--champion-version=",
        ]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --task-metrics: ") and "'shutil:copyfile': shutil is in the standard library" in err
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


@pytest.mark.parametrize(
    ("metric", "refusal"),
    [
        ("mlflow.__main__:x", "mlflow.__main__ is not in this project's packages"),  # MLflow's CLI on our argv
        ("tqdm.__main__:x", "tqdm.__main__ is not in this project's packages"),
        ("cpuinfo.__main__:x", "cpuinfo.__main__ is not in this project's packages"),
        ("jsonschema.__main__:x", "jsonschema.__main__ is not in this project's packages"),
        ("json.tool:main", "json.tool is in the standard library"),
        ("eksflow.cli:main", "eksflow.cli is part of eksflow"),
        ("eksflow.runtime.metrics:task_metric", "eksflow.runtime.metrics is part of eksflow"),
        ("canary_site_pkg:metric", "canary_site_pkg is not in this project's packages"),
        ("canary_site_pkg.mod:metric", "canary_site_pkg.mod is not in this project's packages"),
    ],
    ids=lambda value: value.split(" ")[0],
)
def test_a_module_outside_the_project_is_refused_before_any_import(tmp_path, monkeypatch, metric, refusal):
    site_like = tmp_path / "lib" / "site-packages"  # installed, on the path, outside the project
    write(site_like / "canary_site_pkg" / "__init__.py", CANARY)
    write(site_like / "canary_site_pkg" / "mod.py", CANARY)
    monkeypatch.syspath_prepend(str(site_like))
    monkeypatch.setenv("METRIC_CANARY", str(tmp_path / "canary"))
    module = metric.partition(":")[0]
    already = module in sys.modules
    with pytest.raises(ValidationError) as caught:
        EvaluateSettings(task_metrics=("exact_match", metric), thresholds=())
    (error,) = caught.value.errors()
    assert error["loc"] == ("task_metrics",) and refusal in error["msg"], error["msg"]
    assert "\n" not in error["msg"] and "@eksflow.runtime.task_metric" in error["msg"]
    assert not (tmp_path / "canary").exists()
    assert (module in sys.modules) == already  # nothing was imported


@pytest.mark.parametrize(
    ("layout", "metric", "refusal"),
    [
        ("main", "{pkg}.__main__:x", "{pkg}.__main__ is a __main__ or __init__ module"),
        ("main", "{pkg}.__init__:x", "{pkg}.__init__ is a __main__ or __init__ module"),
        ("top-level-file", "setup_{n}:x", "setup_{n} is not in this project's packages"),
        ("symlink-out", "{pkg}.linked:x", "{pkg}.linked is not in this project's packages"),
        ("shadowed", "{pkg}.mine:starts_alike", "{pkg} is imported from {site}"),
    ],
    ids=["dunder-main", "dunder-init", "top-level-file", "symlink-out", "shadowed-by-installed"],
)
def test_a_project_file_that_runs_code_or_leads_out_is_refused_unimported(
    user_package, tmp_path, monkeypatch, layout, metric, refusal
):
    project, site_like = tmp_path / "project", tmp_path / "lib" / "site-packages"
    n = user_package.rsplit("_", 1)[1]
    write(site_like / "canary.py", CANARY)
    if layout == "main":
        write(project / user_package / "__main__.py", CANARY)
    elif layout == "top-level-file":
        write(project / f"setup_{n}.py", CANARY)
    elif layout == "symlink-out":
        (project / user_package / "linked.py").symlink_to(site_like / "canary.py")
    else:  # an installed package of the project's package name, found first on the path
        write(site_like / user_package / "__init__.py", CANARY)
        monkeypatch.syspath_prepend(str(site_like))
    with pytest.raises(ValidationError) as caught:
        EvaluateSettings(task_metrics=(metric.format(pkg=user_package, n=n),), thresholds=())
    (error,) = caught.value.errors()
    expected = refusal.format(pkg=user_package, n=n, site=site_like / user_package)
    assert expected in error["msg"], error["msg"]
    assert not (tmp_path / "canary").exists()


def test_a_config_naming_an_installed_module_fails_render_in_one_line_and_runs_nothing():
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "pipelines" / "llama_lora.py"),
            "render",
            "--set",
            'evaluate.task_metrics=["exact_match","mlflow.__main__:x"]',
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""  # MLflow's command line did not answer eksflow's argv
    assert done.stderr.startswith("config error: evaluate.task_metrics: "), done.stderr
    assert "mlflow.__main__ is not in this project's packages" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


MY_METRICS = """
    from eksflow.runtime import task_metric


    @task_metric
    def starts_alike(answer: str, reference: str) -> float:
        return float(answer[:3] == reference[:3])
"""


def test_a_metric_of_the_project_renders_and_the_step_in_its_image_layout_accepts_it(tmp_path):
    # A user's project as its image holds it (/app: its packages, PYTHONPATH=/app): this checkout's pipelines
    # (written as a user writes theirs) and a `steps` package of its own holding the metric.
    project = tmp_path / "app"
    shutil.copytree(ROOT / "pipelines", project / "pipelines", ignore=shutil.ignore_patterns("__pycache__"))
    write(project / "steps" / "__init__.py", "")
    write(project / "steps" / "my_metrics.py", MY_METRICS)
    name = "steps.my_metrics:starts_alike"
    env = {**os.environ, "PYTHONPATH": str(project)}

    def python(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, *argv], cwd=project, env=env, capture_output=True, text=True, timeout=120, check=False
        )

    names = ["exact_match", name]
    rendered = python("-m", "pipelines.llama_lora", "render", "--set", f"evaluate.task_metrics={json.dumps(names)}")
    assert rendered.returncode == 0, rendered.stderr
    assert f"--task-metrics={json.dumps(names, separators=(',', ':'))}" in rendered.stdout
    step = python(
        "-m",
        "eksflow.llm.steps.evaluate",
        f"--dataset-dir={tmp_path}",
        f"--adapter-dir={tmp_path / 'no-adapter'}",
        "--base-model=smollm2-135m-instruct",
        f"--report-dir={tmp_path / 'reports'}",
        f"--outputs-dir={tmp_path / 'outputs'}",
        f"--task-metrics={json.dumps(names)}",
        "--thresholds=[]",
        "--champion-version=",
    )
    assert step.returncode == 2, step.stderr  # its arguments passed, the metric included: then the missing adapter
    assert "task metric" not in step.stderr and "no-adapter" in step.stderr, step.stderr


@pytest.mark.parametrize(
    ("written", "reads"),
    [
        ("starts_alike", "{pkg}.mine:starts_alike"),
        ("{pkg}.mine:starts_alike", "{pkg}.mine:starts_alike"),
        ("base_starts_alike", "base_{pkg}.mine:starts_alike"),
        ("starts_alike_gain", "{pkg}.mine:starts_alike_gain"),
        ("exact_match_gain", "exact_match_gain"),
        ("base_eval_loss", "base_eval_loss"),
    ],
    ids=["short", "full", "base-short", "gain-short", "built-in-gain", "base-loss"],
)
def test_a_threshold_names_a_custom_metric_by_its_short_or_full_name(user_package, tmp_path, written, reads):
    full = f"{user_package}.mine:starts_alike"
    written, reads = written.format(pkg=user_package), reads.format(pkg=user_package)
    settings = EvaluateSettings(
        task_metrics=("exact_match", full),
        thresholds=(Threshold(metric=written, op=">=", value=0.5),),
        champion_metric="starts_alike",
    )
    (rule,) = settings.thresholds
    assert rule.metric == reads and settings.champion_metric == full  # the key evaluate's metrics have
    tuned = {"eval_loss": 0.5, "perplexity": 1.65, "exact_match": 0.5, full: 0.75}
    measured = combine(tuned, {**tuned, full: 0.25}, settings.task_metrics)
    reason = gate(measured, settings.thresholds).reason
    assert reads in measured and "missing" not in reason, reason  # the gate reads what evaluate measured
    assert not (tmp_path / "called").exists()


def test_a_short_name_two_task_metrics_share_is_refused_in_one_line_naming_both(user_package):
    mine, other = f"{user_package}.mine:starts_alike", f"{user_package}.other:starts_alike"
    with pytest.raises(ValidationError) as caught:
        EvaluateSettings(
            task_metrics=(mine, other),
            thresholds=(Threshold(metric="starts_alike_gain", value=0.1),),
            champion_metric="starts_alike",
        )
    threshold, champion = caught.value.errors()
    both = f"'starts_alike' is the short name of both {mine} and {other}; name the one you mean in full"
    assert threshold["loc"] == ("thresholds",) and both in threshold["msg"] and "\n" not in threshold["msg"]
    assert champion["loc"] == ("champion_metric",) and both in champion["msg"]
    settings = EvaluateSettings(
        task_metrics=(mine, other), thresholds=(Threshold(metric=f"{other}_gain", value=0.1),), champion_metric=mine
    )
    assert (settings.thresholds[0].metric, settings.champion_metric) == (f"{other}_gain", mine)


def test_a_short_name_is_matched_only_among_the_listed_metrics_and_imports_nothing(user_package, tmp_path):
    with pytest.raises(ValidationError) as caught:
        EvaluateSettings(task_metrics=("exact_match",), thresholds=(Threshold(metric="starts_alike", value=0.5),))
    (error,) = caught.value.errors()
    assert error["msg"].startswith("Value error, threshold on unknown metric 'starts_alike'; known metrics: ")
    assert f"{user_package}.mine" not in sys.modules and user_package not in sys.modules  # declared, never looked up
    assert not (tmp_path / "called").exists()


def test_the_metrics_a_threshold_may_name_are_listed_as_a_user_writes_them(user_package):
    full = f"{user_package}.mine:starts_alike"
    with pytest.raises(ValidationError) as caught:
        EvaluateSettings(task_metrics=("exact_match", full), thresholds=(Threshold(metric="accuracy", value=0.5),))
    (error,) = caught.value.errors()
    assert (
        "known metrics: eval_loss, perplexity, exact_match, starts_alike; each as base_<metric> for the base "
        "model's score, and a task metric as <metric>_gain for tuned - base" in error["msg"]
    ), error["msg"]
    assert "base_eval_loss" not in error["msg"] and f"base_{user_package}" not in error["msg"]
