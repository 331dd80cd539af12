"""The authoring API: typed wiring written once, mistakes caught when the pipeline is built, fan-out, exit handler."""

import types
from pathlib import Path

import pytest
from pydantic import BaseModel, Field

from eksflow import Pipeline, PipelineConfig, PipelineError, StepArgs, ended, task
from eksflow.local.expressions import evaluate_when
from eksflow.refs import Item, Ref
from eksflow.render import manifest
from eksflow.templates import PATH_ARGS_ANNOTATION


def step(name: str, args: type[StepArgs], outputs: type[BaseModel]) -> types.ModuleType:
    module = types.ModuleType(f"mysteps.{name}")
    module.Args = args  # type: ignore[attr-defined]
    module.Outputs = outputs  # type: ignore[attr-defined]
    return module


class MakeArgs(StepArgs):
    size: int = Field(1, ge=1)
    out_dir: Path


class MakeOutputs(BaseModel):
    path: str
    rows: int
    ok: bool


class UseArgs(StepArgs):
    path: str
    rows: float = 0.0
    note: str = ""
    scores: list[float] = []


class UseOutputs(BaseModel):
    score: float


make = step("make", MakeArgs, MakeOutputs)
use = step("use", UseArgs, UseOutputs)


def build(body) -> dict:
    with Pipeline(PipelineConfig(name="t"), title="test", parameters={"source": "data/x"}) as p:
        body(p)
    return manifest(p)


def dag(rendered: dict, name: str = "main") -> dict:
    template = next(t for t in rendered["spec"]["templates"] if t["name"] == name)
    return {t["name"]: t for t in template["dag"]["tasks"]}


def template(rendered: dict, name: str) -> dict:
    return next(t for t in rendered["spec"]["templates"] if t["name"] == name)


def test_an_output_passed_on_wires_the_parameter_and_the_dependency():
    def body(p):
        made = task(make, out_dir=p.run_dir / "x")
        task(use, path=made.path, rows=made.rows)

    rendered = build(body)
    tasks = dag(rendered)
    assert tasks["use"]["depends"] == "make.Succeeded"
    assert tasks["use"]["arguments"]["parameters"] == [
        {"name": "path", "value": "{{tasks.make.outputs.parameters.path}}"},
        {"name": "rows", "value": "{{tasks.make.outputs.parameters.rows}}"},
    ]
    use_template = template(rendered, "use")
    assert use_template["container"]["args"] == [
        "--path={{inputs.parameters.path}}",
        "--rows={{inputs.parameters.rows}}",
        "--outputs-dir=/tmp/outputs",
    ]
    make_template = template(rendered, "make")
    assert make_template["container"]["args"][0] == "--out-dir=/fsx/runs/{{workflow.name}}/x"
    assert make_template["metadata"]["annotations"][PATH_ARGS_ANNOTATION] == "--outputs-dir,--out-dir"
    assert [o["name"] for o in make_template["outputs"]["parameters"]] == ["path", "rows", "ok"]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (lambda p: task(use, path=task(make, out_dir="/x").paths), "task 'make' (mysteps.make) has no output 'paths'"),
        (lambda p: task(use, path=task(make, out_dir="/x").rows), "argument path takes text, but make.rows is int"),
        (lambda p: task(make, out_dir="/x", size=0), "argument size=0: Input should be greater than or equal to 1"),
        (lambda p: task(make, out_dir="/x", colour="red"), "no argument colour; its arguments:"),
        (lambda p: task(make), "missing required argument out_dir"),
        (lambda p: (task(make, out_dir="/x"), task(make, out_dir="/y")), "task name 'make' is used twice"),
        (lambda p: task(use, path="a {{workflow.name}}"), "argument path holds '{{'"),
        (lambda p: task(use, path=p.run_dir / "{{=sprig.env('HOME')}}"), "run_dir / \"{{=sprig.env('HOME')}}\": the"),
        (lambda p: task(use, path="p", when=task(make, out_dir="/x").rows), "an output of kind int is no condition"),
        (lambda p: task(use, path=p.parameters.src), "no workflow parameter 'src'; declared: source"),
        (lambda p: p.workflow_status, "workflow_status is only known in the exit handler"),
    ],
    ids=[
        "unknown-output",
        "wrong-kind",
        "constraint",
        "unknown-arg",
        "missing-arg",
        "twice",
        "braces",
        "braces-in-path",
        "when",
        "param",
        "status",
    ],
)
def test_mistakes_fail_when_the_pipeline_is_built_naming_the_task_and_field(body, message):
    with pytest.raises(PipelineError, match=message.replace("(", r"\(").replace(")", r"\)").replace("{", r"\{")):
        build(body)


def test_one_step_under_two_names_and_conditions_on_bool_outputs():
    def body(p):
        made = task(make, out_dir="/x")
        task(use, task_name="use-when-ok", path=made.path, when=made.ok)
        task(use, task_name="use-when-not", path=made.path, when=~made.ok, note=p.parameters.source)

    tasks = dag(build(body))
    assert tasks["use-when-ok"]["when"] == "{{tasks.make.outputs.parameters.ok}} == true"
    assert tasks["use-when-not"]["when"] == "{{tasks.make.outputs.parameters.ok}} == false"
    assert tasks["use-when-not"]["depends"] == "make.Succeeded"


def test_after_orders_tasks_that_share_no_data():
    def body(p):
        first = task(make, out_dir="/x")
        task(use, path="p", after=first)

    assert dag(build(body))["use"]["depends"] == "make.Succeeded"


def test_fan_out_runs_a_sub_dag_per_item_and_collects_lists():
    def body(p):
        made = task(make, out_dir="/x")

        def candidate(item: Item) -> dict[str, Ref]:
            used = task(use, path=made.path, rows=item.rows, note=item.label)
            return {"score": used.score}

        candidates = p.fan_out(candidate, [{"rows": 1, "label": "a"}, {"rows": 2, "label": "b"}])
        task(use, task_name="best", path="p", scores=candidates.score)

    rendered = build(body)
    tasks = dag(rendered)
    outer = tasks["candidate"]
    assert outer["withItems"] == [{"rows": 1, "label": "a"}, {"rows": 2, "label": "b"}]
    assert outer["depends"] == "make.Succeeded"
    assert {a["name"]: a["value"] for a in outer["arguments"]["parameters"]} == {
        "make_path": "{{tasks.make.outputs.parameters.path}}",
        "item_rows": "{{item.rows}}",
        "item_label": "{{item.label}}",
    }
    inner = template(rendered, "candidate")
    assert [i["name"] for i in inner["inputs"]["parameters"]] == ["make_path", "item_rows", "item_label"]
    assert inner["outputs"]["parameters"] == [
        {"name": "score", "valueFrom": {"parameter": "{{tasks.use.outputs.parameters.score}}"}}
    ]
    assert {a["name"]: a["value"] for a in inner["dag"]["tasks"][0]["arguments"]["parameters"]} == {
        "path": "{{inputs.parameters.make_path}}",
        "rows": "{{inputs.parameters.item_rows}}",
        "note": "{{inputs.parameters.item_label}}",
    }
    assert tasks["best"]["depends"] == "candidate.Succeeded"


def test_items_must_share_their_keys():
    def body(p):
        p.fan_out(lambda item: {"score": task(use, path=item.label).score}, [{"label": "a"}, {"x": "b"}], task_name="c")

    with pytest.raises(PipelineError, match="every item must be an object with the keys"):
        build(body)


def test_exit_handler_sees_the_workflow_status():
    def body(p):
        task(make, out_dir="/x")
        with p.on_exit():
            task(use, task_name="cleanup", path="p", note=p.workflow_status)

    rendered = build(body)
    assert rendered["spec"]["onExit"] == "exit-handler"
    assert template(rendered, "cleanup")["container"]["args"][1] == "--note={{workflow.status}}"
    assert "cleanup" in dag(rendered, "exit-handler")


def test_after_ended_waits_for_a_task_whatever_its_outcome():
    def body(p):
        with p.on_exit():
            first = task(use, task_name="rollback", path="p", note=p.workflow_status)
            task(use, task_name="page", path="p", note="x", after=ended(first))

    page = dag(build(body), "exit-handler")["page"]
    assert page["depends"] == "(rollback.Succeeded || rollback.Skipped || rollback.Failed || rollback.Errored)"


def test_task_outside_a_pipeline_is_an_error():
    with pytest.raises(PipelineError, match=r"inside `with Pipeline"):
        task(make, out_dir="/x")


def test_a_module_without_a_contract_is_not_a_step():
    with pytest.raises(PipelineError, match="is not a step: it needs `class Args"):
        build(lambda p: task(types.ModuleType("mysteps.empty")))


def test_conditions_compare_typed_outputs_and_combine_as_written():
    def body(p):
        made = task(make, out_dir="/x")
        used = task(use, path=made.path)
        task(use, task_name="enough-rows", path="p", when=made.rows >= 100)
        task(use, task_name="tiny-score", path="p", when=used.score < 1e-05)
        task(use, task_name="rows-is-8", path="p", when=made.rows.eq(8) | made.rows.ne(16))
        task(use, task_name="combined", path="p", when=(used.score > made.rows) & ~made.ok)

    tasks = dag(build(body))
    rows, ok = "{{tasks.make.outputs.parameters.rows}}", "{{tasks.make.outputs.parameters.ok}}"
    score = "{{tasks.use.outputs.parameters.score}}"
    assert tasks["enough-rows"]["when"] == f"{rows} >= 100"
    assert tasks["enough-rows"]["depends"] == "make.Succeeded"
    assert tasks["tiny-score"]["when"] == f"{score} < 0.00001"  # govaluate reads no exponent
    assert tasks["rows-is-8"]["when"] == f"({rows} == 8) || ({rows} != 16)"
    assert tasks["combined"]["when"] == f"({score} > {rows}) && ({ok} == false)"
    assert tasks["combined"]["depends"] == "use.Succeeded && make.Succeeded"
    # what Argo (and the local executor) decides once the outputs are substituted
    substituted = {rows: "120", ok: "false", score: "0.5"}
    decided = {}
    for name in ("enough-rows", "tiny-score", "rows-is-8", "combined"):
        expression = tasks[name]["when"]
        for placeholder, value in substituted.items():
            expression = expression.replace(placeholder, value)
        decided[name] = evaluate_when(expression)
    assert decided == {"enough-rows": True, "tiny-score": False, "rows-is-8": True, "combined": False}


@pytest.mark.parametrize(
    ("condition", "message"),
    [
        (lambda made, used: made.path >= 1, "compares int and text; a condition compares numbers"),
        (lambda made, used: made.ok < 1, "compares bool and int"),
        (lambda made, used: made.rows >= "9", "'9' is no constant a condition can compare"),
        (lambda made, used: made.rows.eq(float("inf")), "inf is no constant"),
        (lambda made, used: made.rows.eq(True), "compares bool and int"),
    ],
    ids=["text", "bool-order", "text-constant", "nan", "bool-int"],
)
def test_a_condition_of_the_wrong_type_fails_when_the_pipeline_is_built(condition, message):
    def body(p):
        made = task(make, out_dir="/x")
        task(use, path="p", when=condition(made, None))

    with pytest.raises(PipelineError, match=message):
        build(body)


def test_a_condition_used_as_a_python_bool_says_how_to_combine():
    def body(p):
        made = task(make, out_dir="/x")
        task(use, path="p", when=made.rows > 1 and made.ok)

    with pytest.raises(PipelineError, match=r"combine conditions with &, \| and ~"):
        build(body)


@pytest.mark.parametrize(
    ("condition", "message"),
    [
        (lambda made: made.rows == 0, "make.rows == 0: compare an output with make.rows.eq(...), not =="),
        (lambda made: made.rows != 0, "make.rows != 0: compare an output with make.rows.ne(...), not !="),
        (lambda made: made.ok and made.ok, "make.ok has no value while the pipeline is built"),
        (lambda made: True, "task 'use': when=True is a Python value, decided while the pipeline is built"),
        (lambda made: "x", "task 'use': when='x' is a Python value"),
    ],
    ids=["eq", "ne", "and", "bool", "text"],
)
def test_a_python_comparison_of_an_output_fails_in_one_line_naming_the_method(condition, message):
    def body(p):
        made = task(make, out_dir="/x")
        task(use, path="p", when=condition(made))

    with pytest.raises(PipelineError) as refused:
        build(body)
    assert str(refused.value).startswith(message), refused.value
    assert "\n" not in str(refused.value)


def test_outputs_stay_usable_as_keys():
    def body(p):
        made = task(make, out_dir="/x")
        rows, again = made.rows, made.rows
        assert {rows: 1, again: 2}[rows] == 1 and len({rows, again, rows}) == 2
        assert rows in [rows] and rows is not again

    build(body)


@pytest.mark.parametrize(
    ("when", "message"),
    [
        (lambda made: made.path, "when=make.path: an output of kind text is no condition, and a condition cannot read "
         "text: compare text in the step that writes it, and output a bool"),
        (lambda made: made.path >= 1, "when=make.path >= 1: compares int and text; a condition compares numbers "
         "(< <= > >= .eq .ne) or bools (.eq .ne); compare text in the step that writes it, and output a bool"),
        (lambda made: made.rows, "when=make.rows: an output of kind int is no condition; compare it (e.g. make.rows "
         ">= 0.9 or make.rows.eq(0)) or output a bool"),
    ],
    ids=["text", "text-compared", "number"],
)  # fmt: skip
def test_a_condition_on_text_advises_comparing_it_in_the_step(when, message):
    def body(p):
        made = task(make, out_dir="/x")
        task(use, path="p", when=when(made))

    with pytest.raises(PipelineError) as refused:
        build(body)
    assert str(refused.value).removeprefix("task 'use': ") == message


def exit_task(p, **values):
    with p.on_exit():
        return task(use, task_name="cleanup", path="p", **values)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (lambda p: task(use, path="p", after=exit_task(p)), "task 'use': after=cleanup is a task of the exit handler, "
         "which runs only once the main DAG has ended; put this task in the exit handler too"),
        (lambda p: exit_task(p, after=task(make, out_dir="/x")), "task 'cleanup': after=make is a main-DAG task; the "
         "exit handler runs once the main DAG has ended, whatever its outcome: drop the after="),
        (lambda p: exit_task(p, note=task(make, out_dir="/x").path), "task 'cleanup' reads make.path, an output of a "
         "main-DAG task, which Argo's exit handler cannot read: have that task write it into the run folder"),
        (lambda p: exit_task(p, when=task(make, out_dir="/x").ok), "task 'cleanup': when= reads make.ok, an output "
         "of a main-DAG task, which Argo's exit handler cannot read"),
        (lambda p: task(use, path="p", rows=exit_task(p).score), "task 'use' reads cleanup.score, an output of an "
         "exit-handler task: the exit handler runs once the main DAG has ended"),
    ],
    ids=["main-after-exit", "exit-after-main", "exit-reads-main", "exit-when-main", "main-reads-exit"],
)  # fmt: skip
def test_the_main_dag_and_the_exit_handler_do_not_wait_for_or_read_each_other(body, message):
    with pytest.raises(PipelineError) as refused:
        build(body)
    assert str(refused.value).startswith(message), refused.value


def test_after_a_task_outside_a_fan_out_orders_the_fan_out():
    def body(p):
        first = task(make, out_dir="/x")
        p.fan_out(lambda item: {"score": task(use, path=item.value, after=first).score}, ["a", "b"], task_name="each")

    rendered = build(body)
    assert dag(rendered)["each"]["depends"] == "make.Succeeded"
    assert "depends" not in dag(rendered, "each")["use"]


def test_after_a_task_inside_a_fan_out_is_refused_naming_the_fan_out():
    def body(p):
        inside = []
        p.fan_out(lambda item: {"score": inside.append(task(use, path=item.value)) or inside[0].score}, ["a"],
                  task_name="each")  # fmt: skip
        task(make, out_dir="/x", after=inside[0])

    with pytest.raises(PipelineError, match=r"^task 'make': after=use is inside fan-out 'each'; wait for the whole"):
        build(body)
