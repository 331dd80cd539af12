"""A replica the fleet loses while a canary step measures is the fleet's failure, not the candidate's.

Before, one request failing with a lost replica's node gave `error_rate = 0.0250 fails error_rate <= 0`: a good
candidate was rolled back, tagged Degraded, and nothing named the lost node. The analysis here is the real one
(canary_step.run) against a real sqlite registry, replicas and a proxy that are real HTTP servers
(tests/unit/steps/fake_fleet.py), and the local fleet's endpoints file, which the test rewrites as the fleet would
when a pod goes.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from eksflow.llm.steps import canary
from eksflow.llm.steps.canary import fleet as canary_fleet
from eksflow.llm.steps.canary import step as canary_step
from eksflow.llm.steps.common import litellm_proxy, rollout
from eksflow.runtime.args import StepFailedError
from eksflow.runtime.rundir import RUN_DIR_ENV
from tests.unit.steps.fake_fleet import SERVICE, Proxy, Replica, list_endpoints, registry

MODEL = "llama-lora"
CHAMPION, CANDIDATE = "llama-lora-v1-aaaaaaaa", "llama-lora-v2-bbbbbbbb"
LIVE = 24  # live requests at the 10 % step (canary_sizing, default tolerance)


class Fleet:
    """Replicas by pod name, the endpoints the local fleet lists, and the run's canary arguments."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.tmp_path = tmp_path
        self.uri = registry(tmp_path, MODEL)
        for name in (CHAMPION, CANDIDATE):
            (tmp_path / "adapters" / name).mkdir(parents=True)
        monkeypatch.setenv(RUN_DIR_ENV, str(tmp_path / "run"))
        self.lock = threading.Lock()
        self.pods: dict[str, tuple[str, Replica]] = {}
        self.service = self.add("vllm-b", "node-2")  # what the Service's address reaches in these tests

    def add(self, pod: str, node: str) -> Replica:
        replica = Replica(self.tmp_path / "adapters", loaded=[CHAMPION, CANDIDATE])
        with self.lock:
            self.pods[pod] = (node, replica)
            self.publish()
        return replica

    def lose(self, pod: str) -> None:
        """The pod's node goes: nothing answers at its address, and the fleet takes it out of the endpoints."""
        with self.lock:
            _, replica = self.pods.pop(pod)
            replica.stop()
            self.publish()

    def publish(self) -> None:
        list_endpoints(self.tmp_path / "run", [(pod, node, r) for pod, (node, r) in sorted(self.pods.items())])

    def args(self, proxy: Proxy) -> canary.Args:
        state = rollout.RolloutState(
            champion_version="1", champion_slot="blue", champion_adapter=CHAMPION, candidate_version="2",
            candidate_slot="green", candidate_adapter=CANDIDATE, percent=10, stage="shift-10",
        )  # fmt: skip
        rollout.write_state(self.tmp_path / "rollout" / "state.json", state)
        return canary.Args.model_validate(
            {
                "model_name": MODEL,
                "tracking_uri": self.uri,
                "vllm_url": self.service.url,
                "fleet": SERVICE,
                "proxy_url": proxy.url,
                "secrets_dir": self.tmp_path / "secrets",
                "serving_dir": self.tmp_path / "adapters",
                "routes_file": self.tmp_path / "routes.json",
                "state_file": self.tmp_path / "rollout" / "state.json",
                "percent": 10,
                "report_dir": self.tmp_path / "reports",
                "probe_rows": 4,
            }
        )


def proxy(during) -> Proxy:
    return Proxy(litellm_proxy.slot_id(MODEL, "green"), litellm_proxy.slot_id(MODEL, "blue"), during)


def test_a_replica_lost_mid_measurement_is_named_and_the_candidate_measured_again(tmp_path, monkeypatch, capsys):
    fleet = Fleet(tmp_path, monkeypatch)
    fleet.add("vllm-a", "node-1")

    def lose_a_at_the_fifth_request(i: int) -> bool:
        if i != 5:
            return False
        fleet.lose("vllm-a")
        return True  # the request in flight on it fails

    out = canary_step.run(fleet.args(proxy(lose_a_at_the_fifth_request)))
    assert out.metrics["error_rate"] == 0.0  # the verdict is the second measurement's, on a fleet that held
    assert "(the fleet lost a replica, so measured again: measurement 1 (1 of " in out.reason  # the task's output
    report = json.loads(Path(out.report).read_text())
    (discarded,) = report["fleet"]["discarded"]
    assert discarded.startswith("measurement 1 (1 of ") and "requests failed): vllm-a on node-1 (http://" in discarded
    assert "left the fleet's endpoints (its pod ended or its node went)" in discarded
    assert report["fleet"]["replicas"] == [f"vllm-b on node-2 ({fleet.service.url})"] and report["fleet"]["lost"] == []
    assert report["live_traffic"]["requests"] == LIVE
    err = capsys.readouterr().err
    assert "not judging v2 on measurement 1 (1 of" in err and "the fleet serves from vllm-b on node-2" in err
    table = (tmp_path / "reports" / "canary-10.md").read_text()
    assert "not judged, measured again: measurement 1" in table and "vllm-a on node-1" in table


def test_a_fleet_that_loses_a_replica_in_every_measurement_fails_naming_the_fleet_not_the_candidate(
    tmp_path, monkeypatch
):
    fleet = Fleet(tmp_path, monkeypatch)
    fleet.add("vllm-0", "node-1")
    victims = iter(range(canary_fleet.MEASUREMENTS))

    def lose_the_newest_pod_once_per_measurement(i: int) -> bool:
        if i % LIVE != 5:
            return False
        n = next(victims)
        fleet.lose(f"vllm-{n}")
        fleet.add(f"vllm-{n + 1}", f"node-{n + 3}")  # its replacement, ready before the next measurement
        return True

    with pytest.raises(StepFailedError) as failed:
        canary_step.run(fleet.args(proxy(lose_the_newest_pod_once_per_measurement)))
    message = str(failed.value)
    assert message.startswith(
        "canary analysis at 10% failed for v2: the fleet lost a replica during each of 3 measurements, so v2 was not "
        "judged: measurement 1 (1 of "
    ), message
    for n in range(3):
        assert f"vllm-{n} on node-{n + 2 if n else 1}" in message


def test_a_fleet_with_no_replica_left_is_named_as_down_and_not_waited_for(tmp_path, monkeypatch):
    fleet = Fleet(tmp_path, monkeypatch)
    a = fleet.add("vllm-a", "node-1")

    def every_engine_dies(i: int) -> bool:
        if i == 5:
            a.stop()
            fleet.service.stop()  # both pods' processes die; nothing replaces them
        return i >= 5

    with pytest.raises(StepFailedError) as failed:
        canary_step.run(fleet.args(proxy(every_engine_dies)))
    assert str(failed.value).startswith(
        f"canary analysis at 10% failed for v2: the vLLM engine at {fleet.service.url} does not answer"
    ), failed.value
    report = json.loads((tmp_path / "reports" / "canary-10.json").read_text())
    assert report["fleet"]["discarded"] == [] and len(report["fleet"]["lost"]) == 2


def test_a_counter_that_went_down_is_a_restarted_engine():
    assert canary_fleet.restarted(120.0, 3.0)
    assert not canary_fleet.restarted(120.0, 121.0) and not canary_fleet.restarted(None, 3.0)
