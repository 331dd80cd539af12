"""What the node learns of the tasks ahead of a serving pod: read from the running DAGs, as the flagship's are."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from eksflow.local.ahead import known_requests, tasks_ahead
from eksflow.local.book import NodeBook
from eksflow.local.manifest import parse_manifest
from eksflow.local.memo import MemoCache
from eksflow.local.model import ResourceTemplate
from eksflow.local.node import Requests
from eksflow.local.phase import Phase
from eksflow.local.scheduler import Scheduler, Unit
from eksflow.local.substitution import Scope
from tests.unit.local.manifests import container, dag, inputs, params, task, workflow

GI = 2**30
VALUES = {"name": "wf", "uid": "u", "namespace": "local"}


def sized(name: str, cpu: str, memory: str = "1Gi", **extra: Any) -> dict[str, Any]:
    template = container(name, "pass", **extra)
    template["container"]["resources"] = {"requests": {"cpu": cpu, "memory": memory}}
    return template


class Driver:
    """A scheduler whose pods run until the test ends them."""

    def __init__(self, manifest: dict[str, Any], tmp_path: Path) -> None:
        self.parsed = parse_manifest(manifest)
        self.book = NodeBook()
        self.running: dict[str, Unit] = {}
        self.scheduler = Scheduler(
            self.parsed,
            self.book,
            values=VALUES,
            memo=MemoCache(tmp_path, read=False),
            start_pod=self._start,
            stop_reason=str,
        )
        self.root = self.scheduler.begin(self.parsed.dag(self.parsed.entrypoint), "", None, Scope(VALUES))
        self.scheduler.advance(self.root)

    def _start(self, unit: Unit) -> None:
        self.book.set(unit.key, Phase.RUNNING)
        self.running[unit.key] = unit

    def end(self, key: str) -> None:
        del self.running[key]
        self.book.set(key, Phase.SUCCEEDED)
        self.scheduler.advance(self.root)

    def ahead(self, key: str) -> dict[str, Requests | None]:
        return dict(tasks_ahead(self.scheduler.runs(), key, self.parsed.templates))


def flagship(**main: Any) -> dict[str, Any]:
    """The flagship's shape: the fleet starts with the data staged; the canary needs it and the registered model."""
    return workflow(
        [
            task("validate", "one"),
            task("fleet", "fleet"),
            task("train", "every", "validate"),
            task("evaluate", "one", "train"),
            task("register", "one", "evaluate"),
            task("canary", "one", "fleet && register"),
            task("report", "one", "canary"),
        ],
        [sized("one", "1"), sized("every", "2", "12Gi"), sized("fleet", "14", "48Gi")],
        **main,
    )


def test_training_is_ahead_of_the_fleet_until_it_starts_and_what_needs_the_fleet_never_is(tmp_path: Path) -> None:
    run = Driver(flagship(), tmp_path)
    assert set(run.running) == {"validate", "fleet"}
    one, every = Requests(1000, GI), Requests(2000, 12 * GI)
    assert run.ahead("fleet") == {"train": every, "evaluate": one, "register": one}  # canary, report come after it
    run.end("validate")
    assert run.ahead("fleet") == {"evaluate": one, "register": one}  # training runs now: the node sees it holding
    run.end("train")
    assert run.ahead("fleet") == {"register": one}


def test_what_a_task_ahead_will_ask_is_unknown_while_its_inputs_or_a_fan_out_decide_it(tmp_path: Path) -> None:
    by_input = sized("by-input", "{{inputs.parameters.cpu}}", inputs=inputs("cpu"))
    manifest = workflow(
        [
            task("fleet", "one"),
            task("gate", "one"),
            task("queued", "by-input", arguments=params(cpu="1")),  # its inputs are bound once it is queued
            task("sized-later", "by-input", "gate", arguments=params(cpu="1")),
            task("fan", "one", "gate", withItems=["a", "b"]),
            task("nested", "inner", "gate"),
            task("after", "one", "fleet"),
        ],
        [sized("one", "1"), by_input, dag("inner", [task("a", "one")])],
        parallelism=2,
    )
    run = Driver(manifest, tmp_path)
    assert set(run.running) == {"fleet", "gate"}
    unknown = {"sized-later": None, "fan": None, "nested": None}
    assert run.ahead("fleet") == {"queued": Requests(1000, GI), **unknown}


def test_a_resource_asks_what_its_pods_ask_and_nothing_without_pods_or_as_a_serving_pod() -> None:
    def resource(manifest: str) -> ResourceTemplate:
        return ResourceTemplate("r", (), (), None, None, None, manifest, paths=None)  # type: ignore[arg-type]

    job = """
kind: Job
spec:
  template:
    spec:
      containers: [{name: c, image: x, resources: {requests: {cpu: "{{workflow.parameters.cpu}}", memory: 1Gi}}}]
"""
    scope = Scope({"parameters.cpu": "3"})
    assert known_requests(resource(job), scope) == Requests(3000, GI)
    assert known_requests(resource(job), Scope({})) is None  # the parameter decides it: not known here
    assert known_requests(resource("kind: Service\nspec: {ports: [{port: 80}]}\n"), Scope({})) == Requests()
    deployment = job.replace("kind: Job", "kind: Deployment").replace('"{{workflow.parameters.cpu}}"', "14")
    assert known_requests(resource(deployment), Scope({})) == Requests()
