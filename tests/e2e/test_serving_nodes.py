"""The serving fleet across simulated nodes: the vLLM Deployment's two replicas on two nodes, the proxy on a third.

`run --nodes 3` of the rollout workflow: each of the Deployment's pods runs the real vLLM engine (CPU build) in its
own network namespace on its own node, the LiteLLM proxy on another, and the Services spread connections over the
ready pods (eksflow/llm/serving/fleet_nodes.py, eksflow/local/service_proxy.py). The first run canaries a good
candidate through both replicas, loses one's node mid-canary, and promotes it; the second loses a replica's node
while users ask the champion through the proxy, rolls a broken candidate back and finds it on no replica after.
Two engines start in each run, so both are drills
(`pytest -m drill tests/e2e/test_serving_nodes.py -s`); what `make test` runs is the same machinery on the proxy's
Deployment alone (real LiteLLM pods, no engine). Needs root and iproute2 (CI runs as root).
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections import Counter

import pytest

from eksflow.llm.serving import fleet_pods, objects
from eksflow.llm.serving.local_fleet import LocalFleet
from eksflow.llm.steps.common import rollout, tracking, vllm_client
from eksflow.local.handlers import NodesContext
from eksflow.local.node import machine
from eksflow.local.pod_network import unavailable
from eksflow.local.sim_nodes import SimulatedCluster
from tests.e2e.rollouts import MODEL, PROMPT, ROOT, Run, demo_adapter_trained, outputs, published, register_versions
from tests.e2e.test_nodes import leftovers, lose_node
from tests.flagship import config

pytestmark = [pytest.mark.slow, pytest.mark.skipif(bool(unavailable()), reason=unavailable() or "")]
ONE_PROXY = "serving.proxy_replicas=1"  # one proxy pod: on the third node, beside the two engines' nodes

NOTICE_S = 2.0  # a lost pod is out of its Services by then (fleet_nodes.py watches every 0.5 s)
LOSS_AFTER_S = 5.0  # into analyze-10: its live traffic is under way


@pytest.fixture(scope="module")
def state(tmp_path_factory):
    return tmp_path_factory.mktemp("state")


@pytest.fixture(scope="module")
def registry(state, tmp_path_factory, model_cache, demo_adapter):
    adapter, report = demo_adapter_trained(tmp_path_factory, model_cache, demo_adapter)
    return register_versions(state, adapter, report, tmp_path_factory.mktemp("adapters"))


def pods_by_role(run: Run) -> dict[str, list[dict[str, str]]]:
    """The fleet's pods by role (vllm, litellm), from status.json."""
    nodes = json.loads((run.run_dir / "status.json").read_text())["status"]["nodes"].values()
    found: dict[str, list[dict[str, str]]] = {}
    for node in nodes:
        for pod in node.get("pods") or []:
            if pod["role"] in ("vllm", "litellm"):
                found.setdefault(pod["role"], []).append(pod)
    return found


def pod_log(run: Run, pod: dict[str, str]) -> str:
    return (run.run_dir / "logs" / f"fleet-{pod['name']}.log").read_text(errors="replace")


@pytest.mark.drill
def test_the_canary_runs_through_two_replicas_on_two_nodes_and_promotes_through_a_replicas_loss(
    state, model_cache, registry
):
    """A good candidate, and one replica's node lost 5 s into analyze-10 (the tester's drill): a request in flight on it
    fails, which the analysis names with the node and does not judge the candidate on; it measures again on the fleet
    left and the candidate is promoted. Before, `error_rate = 0.0250 fails error_rate <= 0` rolled it back Degraded."""
    before = leftovers()
    run = Run(state, model_cache, "2", ONE_PROXY, nodes=3)
    run.wait_for("analyze-10", "Running")
    engines, (proxy,) = pods_by_role(run)["vllm"], pods_by_role(run)["litellm"]
    assert len(engines) == 2 and len({p["hostNodeName"] for p in engines}) == 2, engines
    assert proxy["hostNodeName"] not in {p["hostNodeName"] for p in engines}
    time.sleep(LOSS_AFTER_S)
    victim = engines[0]
    lose_node(engines, victim["hostNodeName"])
    result = run.finish()
    assert result.phase == "Succeeded", result.message
    print(f"\nvLLM pods: {[(p['name'], p['hostNodeName'], p['podIP']) for p in engines]}; proxy on {proxy}")
    # Each replica loaded the candidate from the shared adapter folder before any weight moved (load-candidate asks
    # every one on its own address).
    candidate = published(registry, "2")
    for pod in engines:
        assert f"Resolved and loaded LoRA adapter '{candidate}'" in pod_log(run, pod), pod["name"]
    for percent in (10, 50, 100):
        report = run.report(percent)
        assert report["passed"] and report["metrics"]["error_rate"] == 0.0, report["metrics"]
    discarded = run.report(10)["fleet"]["discarded"]
    print(f"analyze-10 measured again: {discarded}")
    assert discarded and f"{victim['name']} on {victim['hostNodeName']}" in discarded[0], discarded
    assert str(tracking.alias_version(registry, MODEL, tracking.CHAMPION).version) == "2"
    assert leftovers() == before, "pods, namespaces or the bridge outlived the run"


@pytest.mark.drill
def test_a_lost_replica_node_keeps_the_champion_answering_through_the_proxy(state, model_cache, registry):
    serving = str(tracking.alias_version(registry, MODEL, tracking.CHAMPION).version)  # "2" after the canary above
    champion = published(registry, serving)
    run = Run(state, model_cache, "3", ONE_PROXY, nodes=3)
    run.wait_for("load-candidate", "Succeeded")
    pods = pods_by_role(run)
    (proxy,) = pods["litellm"]
    url = f"http://{proxy['podIP']}:4000"
    key = (run.run_dir / "volumes" / "eksflow-serving" / "litellm-master-key").read_text()
    answers: list[tuple[float, vllm_client.Answer]] = []  # (sent, answer)

    def ask_the_champion() -> None:
        # Until the rollout ends (its exit handler starts): the fleet stops with the run, after that handler.
        while run.thread.is_alive() and run.node("onExit.finish-rollout").get("phase") in (None, "Pending"):
            sent = time.monotonic()
            answers.append((sent, vllm_client.chat(url, MODEL, PROMPT, api_key=key, timeout_s=120)))
            time.sleep(0.2)

    asker = threading.Thread(target=ask_the_champion, daemon=True)
    asker.start()
    while len(answers) < 3:
        assert run.thread.is_alive(), "the run ended before the champion answered three times"
        time.sleep(0.2)
    victim = pods["vllm"][0]
    lost_at = time.monotonic()
    lose_node(pods["vllm"], victim["hostNodeName"])
    result = run.finish()
    asker.join(300)
    assert result.phase == "Failed"  # the broken candidate is rolled back
    assert outputs(run.node("onExit.finish-rollout"))["champion_serving"] == "true"
    assert str(tracking.alias_version(registry, MODEL, tracking.CHAMPION).version) == serving
    assert rollout.version_tags(registry, MODEL, "3")[rollout.PHASE_TAG] == "Degraded"
    # RO9: no replica holds the candidate after the rollback, each checked on its own address by the exit handler;
    # every pod that loaded it logged its unloading, but the one lost with its node.
    assert outputs(run.node("onExit.finish-rollout"))["candidate_left_on"] == ""
    candidate = published(registry, "3")
    for log in (run.run_dir / "logs").glob("fleet-*vllm*.log"):
        text = log.read_text(errors="replace")
        if f"Resolved and loaded LoRA adapter '{candidate}'" in text and victim["name"] not in log.name:
            assert f"Removed LoRA adapter: name '{candidate}'" in text, log.name
    # The lost pod leaves the Service within a watch period (0.5 s) of its process's end; a request sent before
    # that can still go to it, over the proxy's pooled connection (no retry: num_retries 0), and fail.
    noticing = [a for sent, a in answers if lost_at <= sent < lost_at + NOTICE_S]
    after = [a for sent, a in answers if sent >= lost_at + NOTICE_S]
    print(
        f"\nnode {victim['hostNodeName']} lost: {len(answers)} requests to {champion} through the proxy; "
        f"{len(noticing)} sent in the {NOTICE_S:.0f} s after the loss ({sum(not a.ok for a in noticing)} failed), "
        f"{len(after)} after ({sum(not a.ok for a in after)} failed); replaced: {pods_by_role(run)['vllm']}"
    )
    assert all(a.ok for sent, a in answers if sent < lost_at)
    assert len(after) >= 3 and all(a.ok for a in after), [a for a in after if not a.ok]
    assert sum(not a.ok for a in noticing) <= 1  # one asker: its one pooled connection to the lost pod


def test_the_proxys_pods_spread_over_two_nodes_and_a_lost_ones_is_replaced_while_the_service_answers(tmp_path):
    """The proxy's Deployment (two replicas, real LiteLLM) on two simulated nodes: one pod per node, the Service's
    address answers through either; a node is lost: its pod leaves the Service at once (every request after that is
    answered by the other), and a new pod on a new node joins it once ready. Nothing is left when the fleet stops."""
    before = leftovers()
    cfg = config(["serving.proxy_replicas=2"])
    cluster = SimulatedCluster(2, machine(), tmp_path / "notices")
    listed: list[list[dict[str, str]]] = []
    nodes = NodesContext(cluster, spawn=None, reap=None, pods_changed=listed.append)  # type: ignore[arg-type]
    fleet = LocalFleet(tmp_path / "state", tmp_path / "run", ROOT)
    try:
        notes = [fleet.apply(obj, obj["kind"], lambda: "", nodes=nodes) for obj in objects.proxy_objects(cfg)]
        pods = listed[-1]
        assert len({p["hostNodeName"] for p in pods}) == 2 and "2 pod(s) started" in notes[1], (pods, notes[1])
        service = re.search(r"http://[0-9.]+:[0-9]+", notes[2]).group(0)  # type: ignore[union-attr]
        assert all(fleet_pods.status(f"{service}/health/liveliness") == 200 for _ in range(4))
        lose_node(pods, pods[0]["hostNodeName"])
        lost_at = time.monotonic()
        answers: list[tuple[float, int]] = []  # (sent, status)
        while time.monotonic() - lost_at < 180 and not (_replaced(listed[-1], pods) and _all_ready(fleet)):
            answers.append((time.monotonic(), fleet_pods.status(f"{service}/health/liveliness")))
            time.sleep(0.5)
        print(f"\n{len(answers)} requests while the lost pod was replaced: {Counter(s for _, s in answers)}")
        assert _all_ready(fleet), "no replacement pod became ready within 180 s"
        after = [status for sent, status in answers if sent >= lost_at + NOTICE_S]
        assert after and set(after) == {200}, answers
        assert {p["hostNodeName"] for p in listed[-1]} == {pods[1]["hostNodeName"], "node-3"}
    finally:
        fleet.stop()
        cluster.close()
    assert leftovers() == before


def _replaced(now: list[dict[str, str]], before: list[dict[str, str]]) -> bool:
    """Whether the pods listed now are as many as before, the first of them (the lost one) replaced."""
    return len(now) == len(before) and before[0]["name"] not in {p["name"] for p in now}


def _all_ready(fleet: LocalFleet) -> bool:
    (proxy,) = fleet._processes.values()
    return proxy.replicas is not None and proxy.replicas.available()
