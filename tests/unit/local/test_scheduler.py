"""The scheduler alone, with pods that end when the test says: order, limits, fail fast and DAG outcomes."""

from collections.abc import Callable
from pathlib import Path
from typing import Any

from eksflow.local.book import NodeBook
from eksflow.local.manifest import parse_manifest
from eksflow.local.memo import MemoCache
from eksflow.local.phase import Phase
from eksflow.local.scheduler import Scheduler, Unit
from eksflow.local.substitution import Scope
from tests.unit.local.manifests import container, dag, inputs, params, task, workflow

VALUES = {"name": "wf", "uid": "u", "namespace": "local"}


def drive(
    manifest: dict[str, Any], tmp_path: Path, ends: Callable[[Unit], Phase]
) -> tuple[Phase, str | None, NodeBook, list[str], int]:
    """Run the scheduler to the end; each pass ends the oldest running pod with `ends(unit)`.

    Returns the DAG's outcome, the book, the order pods started in and the most pods ever running at once.
    """
    parsed = parse_manifest(manifest)
    book = NodeBook()
    running: list[Unit] = []
    started: list[str] = []

    def start_pod(unit: Unit) -> None:
        book.set(unit.key, Phase.RUNNING)
        running.append(unit)
        started.append(unit.key)

    scheduler = Scheduler(
        parsed, book, values=VALUES, memo=MemoCache(tmp_path, read=False), start_pod=start_pod, stop_reason=str
    )
    root = scheduler.begin(parsed.dag(parsed.entrypoint), "", None, Scope(VALUES))
    most = 0
    while not root.done:
        scheduler.advance(root)
        most = max(most, len(running))
        if running:
            unit = running.pop(0)
            book.set(unit.key, ends(unit), outputs={"out": unit.inputs.get("v", "")})
    phase, origin = scheduler.outcome(root)
    return phase, origin, book, started, most


def test_parallelism_and_item_order(tmp_path: Path) -> None:
    work = container("work", "pass", inputs=inputs("v"))
    manifest = workflow(
        [
            task("fan", "work", arguments=params(v="{{item}}"), withItems=list("abcde")),
            task("after", "work", "fan", arguments=params(v="z")),
        ],
        [work],
    )
    manifest["spec"]["templates"][-1]["parallelism"] = 2
    phase, _, book, started, most = drive(manifest, tmp_path, lambda unit: Phase.SUCCEEDED)
    assert phase is Phase.SUCCEEDED
    assert started == [f"fan({i}:{c})" for i, c in enumerate("abcde")] + ["after"]
    assert most == 2
    assert book["fan"].phase is Phase.SUCCEEDED


def test_fail_fast_stops_new_iterations_and_omits_the_rest(tmp_path: Path) -> None:
    work = container("work", "pass", inputs=inputs("v"))
    manifest = workflow([task("fan", "work", arguments=params(v="{{item}}"), withItems=list("abcd"))], [work])
    manifest["spec"]["templates"][-1]["parallelism"] = 1
    phase, origin, book, started, _ = drive(
        manifest, tmp_path, lambda unit: Phase.FAILED if unit.inputs["v"] == "b" else Phase.SUCCEEDED
    )
    assert started == ["fan(0:a)", "fan(1:b)"]
    assert [book[f"fan({i}:{c})"].phase for i, c in enumerate("abcd")] == [
        Phase.SUCCEEDED,
        Phase.FAILED,
        Phase.OMITTED,
        Phase.OMITTED,
    ]
    assert book["fan(2:c)"].message == "not run: fail fast after fan failed"
    assert (phase, origin) == (Phase.FAILED, "fan")


def test_a_dag_outcome_follows_its_leaves(tmp_path: Path) -> None:
    ok = container("ok", "pass")
    manifest = workflow(
        [
            task("a", "ok"),
            task("on-failure", "ok", "a.Failed"),
            task("on-success", "ok", "a.Succeeded"),
        ],
        [ok],
    )
    # a fails: its handler runs; the success branch is omitted and takes a's failure as its outcome.
    phase, origin, book, _, _ = drive(manifest, tmp_path, lambda u: Phase.FAILED if u.key == "a" else Phase.SUCCEEDED)
    assert book["on-failure"].phase is Phase.SUCCEEDED and book["on-success"].phase is Phase.OMITTED
    assert (phase, origin) == (Phase.FAILED, "a")
    # a succeeds: the handler is omitted, but its branch succeeded, so the DAG does.
    phase, origin, book, _, _ = drive(manifest, tmp_path, lambda u: Phase.SUCCEEDED)
    assert book["on-failure"].phase is Phase.OMITTED
    assert (phase, origin) == (Phase.SUCCEEDED, None)


def test_nested_dag_nodes_and_outputs(tmp_path: Path) -> None:
    inner = dag(
        "inner",
        [task("leaf", "work", arguments=params(v="{{inputs.parameters.v}}"))],
        inputs=inputs("v"),
        outputs={"parameters": [{"name": "got", "valueFrom": {"parameter": "{{tasks.leaf.outputs.parameters.out}}"}}]},
    )
    manifest = workflow(
        [task("outer", "inner", arguments=params(v="{{item}}"), withItems=["x", "y"])],
        [container("work", "pass", inputs=inputs("v")), inner],
    )
    phase, _, book, started, _ = drive(manifest, tmp_path, lambda unit: Phase.SUCCEEDED)
    assert phase is Phase.SUCCEEDED
    assert started == ["outer(0:x).leaf", "outer(1:y).leaf"]
    assert book["outer(1:y)"].outputs == {"got": "y"}
    assert book["outer(1:y).leaf"].parent == "outer(1:y)" and book["outer(1:y)"].parent == "outer"
