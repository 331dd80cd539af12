"""The local node: pods placed by their CPU and memory requests, tasks before the serving fleet, as one node would."""

from __future__ import annotations

from pathlib import Path

import pytest

from eksflow.local.errors import LocalExecutorError
from eksflow.local.node import Node, QuantityError, Requests, Ticket, container_requests, pod_requests, quantity
from eksflow.local.phase import Phase
from tests.unit.local.manifests import container, run, task, workflow

GI = 2**30
NODE = Requests(2000, 24 * GI)  # this kind of machine: 2 cores, 24 GiB


def placed(node: Node, holder: str, requests: Requests, *, lasting: bool = False) -> Ticket:
    """Queue a pod, then run a scheduler pass."""
    ticket = node.request(holder, requests, lasting=lasting)
    node.schedule()
    return ticket


@pytest.mark.parametrize(
    ("text", "resource", "value"),
    [
        ("2", "cpu", 2000),
        ("500m", "cpu", 500),
        ("0.5", "cpu", 500),
        ("1.0001", "cpu", 1001),  # rounded up, as the API server does
        ("12Gi", "memory", 12 * GI),
        ("4G", "memory", 4 * 10**9),
        ("1e3", "memory", 1000),
        ("128974848", "memory", 128974848),
    ],
)
def test_quantities_read_as_kubernetes_writes_them(text: str, resource: str, value: int) -> None:
    assert quantity(text, resource) == value


@pytest.mark.parametrize("text", ["two", "2 cores", "-1", "12GB", "", "1Gi; rm -rf /"])
def test_a_quantity_kubernetes_refuses_is_refused(text: str) -> None:
    with pytest.raises(QuantityError, match="quantity"):
        quantity(text, "memory")


def test_a_missing_request_defaults_to_its_limit() -> None:
    assert container_requests({"limits": {"cpu": "2", "memory": "4Gi"}, "requests": {"cpu": "1"}}) == Requests(
        1000, 4 * GI
    )
    assert container_requests(None) == Requests()


def test_an_objects_pods_add_up_with_their_replicas() -> None:
    pod = {"spec": {"containers": [{"resources": {"requests": {"cpu": "1", "memory": "2Gi"}}}]}}
    deployment = {"kind": "Deployment", "spec": {"replicas": 2, "template": pod}}
    assert pod_requests(deployment) == Requests(2000, 4 * GI)
    rayjob = {
        "kind": "RayJob",
        "spec": {
            "rayClusterSpec": {
                "headGroupSpec": {"template": pod},
                "workerGroupSpecs": [{"groupName": "w", "replicas": 3, "template": pod}],
            }
        },
    }
    assert pod_requests(rayjob) == Requests(4000, 8 * GI)
    assert pod_requests({"kind": "Service", "spec": {"ports": [{"port": 80}]}}) == Requests()


def test_tasks_are_placed_before_the_serving_fleet_and_the_fleet_after_them() -> None:
    node = Node(NODE)
    engine = node.request("vllm", Requests(14000, 48 * GI), lasting=True)  # sized for an m6i.4xlarge
    assert engine.requests == NODE  # no bigger than the machine: it runs here alone
    train = node.request("train", Requests(2000, 12 * GI), lasting=False)
    node.schedule()
    assert train.granted.is_set() and not engine.granted.is_set()
    assert "waits for the tasks ahead of it" in engine.reason
    evaluate = node.request("evaluate", Requests(2000, 8 * GI), lasting=False)
    node.release(train)
    node.schedule()
    assert evaluate.granted.is_set() and not engine.granted.is_set()
    node.release(evaluate)
    node.schedule()
    assert engine.granted.is_set() and not engine.shared


def test_the_fleet_loads_beside_tasks_that_leave_a_core_free_once_no_task_ahead_asks_for_every_core() -> None:
    ahead: list[tuple[str, Requests | None]] = [("train", Requests(2000, 12 * GI))]
    node = Node(NODE, ahead=lambda holder: ahead if holder == "vllm" else [])
    validate = placed(node, "validate", Requests(1000, 2 * GI))
    engine = placed(node, "vllm", Requests(14000, 48 * GI), lasting=True)
    assert not engine.granted.is_set() and "train (ahead, asks cpu 2" in engine.reason  # never before training
    node.release(validate)
    ahead[:] = [("evaluate", Requests(1000, 8 * GI)), ("report", None)]
    train = placed(node, "train", Requests(2000, 12 * GI))
    node.schedule()  # a pass places the tasks, the next one the fleet
    assert train.granted.is_set() and not engine.granted.is_set()
    assert "train (holds cpu 2" in engine.reason and "report (ahead, asks what is not known yet)" in engine.reason
    node.release(train)
    ahead[:] = []
    evaluate = placed(node, "evaluate", Requests(1000, 8 * GI))
    node.schedule()
    assert evaluate.granted.is_set() and engine.granted.is_set() and engine.shared
    assert "loads beside evaluate on the core they leave free" in engine.reason


def test_beside_the_fleet_loading_a_task_asking_nothing_starts_and_one_asking_a_core_waits_for_the_tasks() -> None:
    node = Node(NODE)
    evaluate = placed(node, "evaluate", Requests(1000, 8 * GI))
    engine = placed(node, "vllm", Requests(14000, 48 * GI), lasting=True)
    assert engine.granted.is_set()  # nothing ahead: it loads beside evaluate
    service = node.request("proxy-service", Requests(), lasting=False)
    register = node.request("register", Requests(1000, 8 * GI), lasting=False)
    node.schedule()
    assert service.granted.is_set() and not service.shared  # as Kubernetes checks only what a pod requests
    assert not register.granted.is_set() and "held by evaluate" in register.reason
    node.release(evaluate)
    node.schedule()
    assert register.granted.is_set() and register.shared


def test_a_task_that_does_not_fit_beside_a_task_waits_with_the_reason() -> None:
    node = Node(NODE)
    first = placed(node, "validate", Requests(1000, 2 * GI))
    second = placed(node, "train", Requests(2000, 12 * GI))
    assert first.granted.is_set() and not second.granted.is_set()
    assert "Insufficient cpu" in second.reason and "validate" in second.reason
    node.release(first)
    node.schedule()
    assert second.granted.is_set()


def test_beside_the_fleet_only_a_task_shares_the_machine_rather_than_wait_for_the_run_to_end() -> None:
    node = Node(NODE)
    engine = node.request("vllm", Requests(14000, 48 * GI), lasting=True)
    node.schedule()
    proxy = node.request("proxy", Requests(1000, 2 * GI), lasting=True)
    node.schedule()
    analyze = node.request("analyze-10", Requests(1000, 2 * GI), lasting=False)
    node.schedule()
    assert engine.granted.is_set() and proxy.granted.is_set() and analyze.granted.is_set()
    assert proxy.shared and analyze.shared and "a node of its own" in analyze.reason


def test_a_release_wakes_the_scheduler() -> None:
    woken = []
    node = Node(NODE, on_release=lambda: woken.append(True))
    ticket = node.request("a", Requests(1000, GI), lasting=False)
    node.schedule()
    node.release(ticket)
    assert woken and node.holding() == []


def timed(name: str, cpu: str) -> dict:
    code = "import sys, time; s = time.time(); time.sleep(2); open(sys.argv[1], 'a').write(f'{s} {time.time()}\\n')"
    template = container(name, code, "{{workflow.parameters.log}}")
    template["container"]["resources"] = {"requests": {"cpu": cpu, "memory": "64Mi"}}
    return template


def intervals(path: Path) -> list[tuple[float, float]]:
    return sorted(tuple(map(float, line.split())) for line in path.read_text().splitlines())  # type: ignore[misc]


@pytest.mark.parametrize(("cpu", "overlap"), [("1000", False), ("1m", True)])
def test_two_tasks_run_together_only_when_their_requests_fit_the_machine(
    tmp_path: Path, cpu: str, overlap: bool
) -> None:
    log = tmp_path / "intervals"
    manifest = workflow([task("a", "a"), task("b", "b")], [timed("a", cpu), timed("b", cpu)])
    manifest["spec"]["arguments"] = {"parameters": [{"name": "log", "value": str(log)}]}
    result = run(manifest, tmp_path)
    assert result.phase is Phase.SUCCEEDED
    (_, a_end), (b_start, _) = intervals(log)
    assert (b_start < a_end) is overlap  # 1000 CPUs: each asks for the whole machine, so one runs at a time


def test_a_bad_quantity_fails_before_anything_runs(tmp_path: Path) -> None:
    template = container("a", "pass")
    template["container"]["resources"] = {"requests": {"memory": "lots"}}
    with pytest.raises(LocalExecutorError, match=r"resources\.requests\.memory: memory quantity 'lots'"):
        run(workflow([task("a", "a")], [template]), tmp_path)
