"""Fan-out (withItems, withParam), aggregation of iteration outputs, nested DAGs and their outputs, as in Argo."""

import io
import json
from pathlib import Path

from rich.console import Console

from eksflow.local import NodeType, Phase, resume_workflow
from eksflow.local.display import TaskDisplay, in_tree_order, progress_text
from tests.unit.local.manifests import (
    APPEND,
    WRITE_OUTPUT,
    container,
    dag,
    inputs,
    lines,
    outputs,
    params,
    phases,
    run,
    task,
    workflow,
)

# Writes argv[3] to the output file argv[1]; iteration argv[2] == "0" first waits until the mark file argv[4]
# exists (written by the other iteration), so iterations finish in the opposite order of their items.
SCORE = """
import os, pathlib, sys, time
out, index, value, mark = sys.argv[1:5]
if index == "0":
    deadline = time.monotonic() + 20
    while not os.path.exists(mark) and time.monotonic() < deadline:
        time.sleep(0.02)
else:
    pathlib.Path(mark).touch()
os.makedirs(os.path.dirname(out), exist_ok=True)
open(out, "w").write(value)
"""


def test_with_items_of_objects_names_iterations_and_aggregates_outputs_in_item_order(tmp_path: Path) -> None:
    received = tmp_path / "received"
    grid = [{"rank": 8, "lr": 0.0001}, {"rank": 16, "lr": 2e-05}]
    train = container(
        "train",
        SCORE,
        "/tmp/outputs/score",
        "{{inputs.parameters.index}}",
        "r{{inputs.parameters.rank}}-lr{{inputs.parameters.lr}}",
        str(tmp_path / "mark"),
        inputs=inputs("index", "rank", "lr"),
        outputs=outputs("score"),
    )
    pick = container("pick", APPEND, str(received), "{{inputs.parameters.scores}}", inputs=inputs("scores"))
    manifest = workflow(
        [
            task(
                "train",
                "train",
                arguments=params(index="{{item.index}}", rank="{{item.rank}}", lr="{{item.lr}}"),
                withItems=[{**g, "index": i} for i, g in enumerate(grid)],
            ),
            task("pick", "pick", "train", arguments=params(scores="{{tasks.train.outputs.parameters.score}}")),
        ],
        [train, pick],
    )
    result = run(manifest, tmp_path)
    assert result.phase == "Succeeded", result.message
    first, second = "train(0:index:0,lr:0.0001,rank:8)", "train(1:index:1,lr:0.00002,rank:16)"
    assert list(result.nodes) == ["train", "pick", first, second]
    group = result.nodes["train"]
    assert (group.type, group.phase, group.children) == (NodeType.TASK_GROUP, Phase.SUCCEEDED, [first, second])
    assert result.nodes[second].outputs == {"score": "r16-lr0.00002"}  # Go's JSON spelling of 2e-05
    assert result.nodes[first].display_name == first and result.nodes[first].parent == "train"
    # Item order, although the second iteration finished first; output values stay strings, as Argo keeps them.
    assert lines(received) == ['["r8-lr0.0001","r16-lr0.00002"]']
    status = json.loads((result.run_dir / "status.json").read_text())["status"]["nodes"]
    assert status["train"]["type"] == "TaskGroup"
    assert status["train"]["children"] == [first, second]
    assert status[first]["name"] == f"{result.name}.{first}"
    assert status[first]["displayName"] == first


def test_with_param_from_an_upstream_output_and_item_values(tmp_path: Path) -> None:
    received = tmp_path / "received"
    produce = container(
        "produce", WRITE_OUTPUT, "/tmp/outputs/items", '["a", "b c", {"k": 1}]', outputs=outputs("items")
    )
    echo = container(
        "echo",
        WRITE_OUTPUT,
        "/tmp/outputs/seen",
        '{"item": {{inputs.parameters.v}}}',
        inputs=inputs("v"),
        outputs=outputs("seen"),
    )
    collect = container("collect", APPEND, str(received), "{{inputs.parameters.all}}", inputs=inputs("all"))
    manifest = workflow(
        [
            task("produce", "produce"),
            task(
                "echo",
                "echo",
                "produce",
                arguments=params(v="{{item}}"),
                withParam="{{tasks.produce.outputs.parameters.items}}",
            ),
            task("collect", "collect", "echo", arguments=params(all="{{tasks.echo.outputs.parameters}}")),
        ],
        [produce, echo, collect],
    )
    result = run(manifest, tmp_path)
    assert result.phase == "Succeeded", result.message
    assert [k for k in result.nodes if k.startswith("echo(")] == ["echo(0:a)", "echo(1:b c)", "echo(2:k:1)"]
    assert result.nodes["echo(2:k:1)"].outputs == {"seen": '{"item": {"k":1}}'}
    # tasks.X.outputs.parameters: one map of parameters per iteration, in item order
    assert json.loads(lines(received)[0]) == [
        {"seen": '{"item": a}'},
        {"seen": '{"item": b c}'},
        {"seen": '{"item": {"k":1}}'},
    ]


def test_nested_dag_with_inputs_outputs_inside_a_fan_out(tmp_path: Path) -> None:
    received = tmp_path / "received"
    train = container(
        "train",
        WRITE_OUTPUT,
        "/tmp/outputs/adapter",
        "adapter-r{{inputs.parameters.rank}}",
        inputs=inputs("rank"),
        outputs=outputs("adapter"),
    )
    evaluate = container(
        "evaluate",
        WRITE_OUTPUT,
        "/tmp/outputs/report",
        '{"adapter": "{{inputs.parameters.adapter}}", "passed": true}',
        inputs=inputs("adapter"),
        outputs=outputs("report"),
    )
    candidate = dag(
        "candidate",
        [
            task("train", "train", arguments=params(rank="{{inputs.parameters.rank}}")),
            task(
                "evaluate",
                "evaluate",
                "train",
                arguments=params(adapter="{{tasks.train.outputs.parameters.adapter}}"),
            ),
        ],
        inputs=inputs("rank"),
        outputs={
            "parameters": [
                {"name": "report", "valueFrom": {"parameter": "{{tasks.evaluate.outputs.parameters.report}}"}},
                {"name": "rank", "valueFrom": {"parameter": "{{inputs.parameters.rank}}"}},
            ]
        },
    )
    best = container("best", APPEND, str(received), "{{inputs.parameters.reports}}", inputs=inputs("reports"))
    manifest = workflow(
        [
            task("candidates", "candidate", arguments=params(rank="{{item}}"), withItems=[8, 16]),
            task(
                "best", "best", "candidates", arguments=params(reports="{{tasks.candidates.outputs.parameters.report}}")
            ),
        ],
        [train, evaluate, candidate, best],
    )
    result = run(manifest, tmp_path)
    assert result.phase == "Succeeded", result.message
    assert phases(result) == {
        "candidates": "Succeeded",
        "best": "Succeeded",
        "candidates(0:8)": "Succeeded",
        "candidates(0:8).train": "Succeeded",
        "candidates(0:8).evaluate": "Succeeded",
        "candidates(1:16)": "Succeeded",
        "candidates(1:16).train": "Succeeded",
        "candidates(1:16).evaluate": "Succeeded",
    }
    inner = result.nodes["candidates(1:16)"]
    assert inner.type is NodeType.DAG
    assert inner.children == ["candidates(1:16).train", "candidates(1:16).evaluate"]
    assert inner.outputs == {"report": '{"adapter": "adapter-r16", "passed": true}', "rank": "16"}
    assert result.nodes["candidates(1:16).evaluate"].display_name == "evaluate"
    # Every iteration's value is a JSON object, so the aggregate is a list of objects (Argo's rule).
    assert json.loads(lines(received)[0]) == [
        {"adapter": "adapter-r8", "passed": True},
        {"adapter": "adapter-r16", "passed": True},
    ]
    # The live table shows the tree: iterations under their task, a nested DAG's tasks under it.
    tree = [(depth, node.display_name) for depth, node in in_tree_order(list(result.nodes.values()))]
    assert tree[:4] == [(0, "candidates"), (1, "candidates(0:8)"), (2, "train"), (2, "evaluate")]
    assert progress_text(result.nodes["candidates"], result.nodes) == "2/2 done"
    out = io.StringIO()
    table = TaskDisplay(Console(file=out, width=200), lambda: list(result.nodes.values()))._table()
    Console(file=out, width=200).print(table)
    assert "    train" in out.getvalue() and "2/2 done" in out.getvalue()


def test_dag_template_parallelism_limits_running_iterations(tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    code = """
import pathlib, sys, time
marks, me = pathlib.Path(sys.argv[1]), sys.argv[2]
(marks / f"running-{me}").touch()
time.sleep(0.3)
(marks / f"seen-{me}").write_text(",".join(sorted(p.name for p in marks.glob("running-*"))))
(marks / f"running-{me}").unlink()
"""
    work = container("work", code, str(marks), "{{inputs.parameters.me}}", inputs=inputs("me"))
    manifest = workflow(
        [task("fan", "work", arguments=params(me="{{item}}"), withItems=["a", "b", "c", "d"])], [work], parallelism=3
    )
    manifest["spec"]["templates"][-1]["parallelism"] = 2  # the DAG template's own limit, tighter than the workflow's
    result = run(manifest, tmp_path)
    assert result.phase == "Succeeded", result.message
    seen = [(marks / f"seen-{n}").read_text().split(",") for n in "abcd"]
    assert max(len(s) for s in seen) <= 2
    assert len(list(marks.glob("seen-*"))) == 4


def test_depends_and_when_over_a_fan_out(tmp_path: Path) -> None:
    code = "import sys; sys.exit(1 if sys.argv[1] == 'bad' else 0)"
    work = container("work", code, "{{inputs.parameters.v}}", inputs=inputs("v"))
    ok = container("ok", "pass")
    manifest = workflow(
        [
            task(
                "fan",
                "work",
                arguments=params(v="{{item}}"),
                withItems=["good", "bad", "skip"],
                when="{{item}} != skip",
            ),
            task("any", "ok", "fan.AnySucceeded"),
            task("all-failed", "ok", "fan.AllFailed"),
            task("bare", "ok", "fan"),
            task("empty", "work", arguments=params(v="{{item}}"), withParam="[]"),
            task("after-empty", "ok", "empty"),
        ],
        [work, ok],
    )
    result = run(manifest, tmp_path)
    assert phases(result) == {
        "fan": "Failed",
        "any": "Succeeded",
        "all-failed": "Omitted",
        "bare": "Omitted",
        "empty": "Skipped",
        "after-empty": "Succeeded",
        "fan(0:good)": "Succeeded",
        "fan(1:bad)": "Failed",
        "fan(2:skip)": "Skipped",
    }
    assert result.nodes["fan"].message.startswith("1 of 3 iterations failed; fan(1:bad): exit code 1")
    assert result.nodes["fan(2:skip)"].message == "when 'skip != skip' evaluated to false"
    assert result.nodes["empty"].message == "Skipped, empty params"
    # `bare` was omitted because `fan` failed: its branch failed, so the workflow did (Argo's leaf rule).
    assert result.phase == "Failed"
    assert result.message.startswith("child 'fan' failed: 1 of 3 iterations failed")


def test_a_with_param_that_is_no_json_list_errors_the_task(tmp_path: Path) -> None:
    manifest = workflow([task("fan", "ok", withParam="{{workflow.parameters.items}}")], [container("ok", "pass")])
    manifest["spec"]["arguments"] = params(items="not json")
    result = run(manifest, tmp_path)
    assert result.nodes["fan"].phase == "Error"
    assert result.nodes["fan"].message.startswith("task 'fan': withParam could not be parsed as a JSON list")
    assert result.phase == "Error"


def test_resume_of_a_partly_failed_fan_out_reruns_only_the_failed_iterations(tmp_path: Path) -> None:
    received = tmp_path / "received"
    # Each iteration appends to its own runs file; it fails unless its fixed-<item> file exists.
    flaky = """
import os, pathlib, sys
root, item = pathlib.Path(sys.argv[1]), sys.argv[2]
with open(root / f"runs-{item}", "a") as f:
    f.write("x\\n")
if not (root / f"fixed-{item}").exists():
    sys.exit(1)
os.makedirs(sys.argv[3], exist_ok=True)
open(os.path.join(sys.argv[3], "value"), "w").write(item.upper())
"""
    work = container(
        "work",
        flaky,
        str(tmp_path),
        "{{inputs.parameters.v}}",
        "/tmp/outputs",
        inputs=inputs("v"),
        outputs=outputs("value"),
    )
    collect = container("collect", APPEND, str(received), "{{inputs.parameters.all}}", inputs=inputs("all"))
    manifest = workflow(
        [
            task("fan", "work", arguments=params(v="{{item}}"), withItems=["a", "b", "c"]),
            task("collect", "collect", "fan", arguments=params(all="{{tasks.fan.outputs.parameters.value}}")),
        ],
        [work, collect],
    )
    manifest["spec"]["templates"][-1]["dag"]["failFast"] = False
    for item in "ac":
        (tmp_path / f"fixed-{item}").touch()
    failed = run(manifest, tmp_path)
    assert phases(failed)["fan(1:b)"] == "Failed" and phases(failed)["collect"] == "Omitted"
    (tmp_path / "fixed-b").touch()
    resumed = resume_workflow(failed.run_dir, cwd=tmp_path, console=Console(file=io.StringIO()))
    assert resumed.phase == "Succeeded", resumed.message
    assert [len(lines(tmp_path / f"runs-{item}")) for item in "abc"] == [1, 2, 1]  # succeeded iterations kept
    assert lines(received) == ['["A","B","C"]']
    assert resumed.nodes["fan"].children == ["fan(0:a)", "fan(1:b)", "fan(2:c)"]
