"""Rollback and promote reach every replica of the fleet, each addressed on its own by the Service's endpoints.

Before, the rollout's steps talked to the fleet's Service only, which reaches one pod per request: a rollback unloaded
the candidate from that pod, and the others kept it (vllm RFC #12174). Here every replica is a real HTTP server
(tests/unit/steps/fake_fleet.py), the endpoints list is the local fleet's own file, and the "Service" address the
steps are given reaches the first replica only, as a Service's connection reaches one pod.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import kubernetes_validate
import pytest

from eksflow.llm.serving import fleet_endpoints
from eksflow.llm.serving.fleet_endpoints import Endpoint
from eksflow.llm.steps import finish_rollout, promote
from eksflow.llm.steps.common import litellm_proxy, replicas, rollout, tracking
from eksflow.llm.steps.common.kube_api import ApiAccess
from eksflow.llm.steps.common.replicas import Replica
from eksflow.runtime.args import StepFailedError
from eksflow.runtime.rundir import RUN_DIR_ENV
from tests.unit.steps.fake_fleet import SERVICE, Proxy, list_endpoints, registry
from tests.unit.steps.fake_fleet import Replica as FakeReplica

MODEL = "llama-lora"
CHAMPION, CANDIDATE = "llama-lora-v1-aaaaaaaa", "llama-lora-v2-bbbbbbbb"


def closed_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


@pytest.fixture
def fleet(tmp_path, monkeypatch) -> Iterator[dict]:
    """Registry (v1 champion, v2 candidate), both adapters published, a run folder; the steps' common arguments."""
    uri = registry(tmp_path, MODEL)
    tracking.promote(uri, MODEL, "1")
    for name in (CHAMPION, CANDIDATE):
        (tmp_path / "adapters" / name).mkdir(parents=True)
    monkeypatch.setenv(RUN_DIR_ENV, str(tmp_path / "run"))
    routes = litellm_proxy.RoutesFile(tmp_path / "routes.json", MODEL)
    routes.assign("blue", CHAMPION, "http://vllm:8000")
    routes.assign("green", CANDIDATE, "http://vllm:8000")
    routes.set_weights(litellm_proxy.weights_for(MODEL, "blue", "green", 10))
    yield {
        "model_name": MODEL,
        "tracking_uri": uri,
        "proxy_url": closed_url(),
        "secrets_dir": tmp_path / "secrets",
        "serving_dir": tmp_path / "adapters",
        "routes_file": tmp_path / "routes.json",
        "state_file": tmp_path / "rollout" / "state.json",
    }


def state(service_url: str, **changes: str) -> rollout.RolloutState:
    """A rollout in its canary: v1 serving from blue, v2 in green, the fleet's Service and address recorded."""
    return rollout.RolloutState.model_validate({
        "champion_version": "1", "champion_slot": "blue", "champion_adapter": CHAMPION, "candidate_version": "2",
        "candidate_slot": "green", "candidate_adapter": CANDIDATE, "percent": 10, "vllm_url": service_url,
        "fleet": SERVICE, "stage": "analyze-10", **changes,
    })  # fmt: skip


def test_a_rollback_unloads_the_candidate_from_every_replica_and_checks_each(fleet, tmp_path, capsys):
    a, b = (FakeReplica(tmp_path / "adapters", loaded=[CHAMPION, CANDIDATE]) for _ in range(2))
    list_endpoints(tmp_path / "run", [("vllm-a", "node-1", a), ("vllm-b", "node-2", b)])
    rollout.write_state(fleet["state_file"], state(a.url, failure="analyze-10: served_gap"))
    out = finish_rollout.run(finish_rollout.Args.model_validate({**fleet, "workflow_status": "Failed"}))
    assert CANDIDATE not in a.loaded and CANDIDATE not in b.loaded  # the pod the Service did not reach, too
    assert CHAMPION in a.loaded and CHAMPION in b.loaded
    assert out.phase == "Degraded" and out.candidate_left_on == ""
    assert not (tmp_path / "adapters" / CANDIDATE).exists()  # unpublished first: no replica resolves it again
    err = capsys.readouterr().err
    assert f"{CANDIDATE} is on no replica: vllm-a on node-1 ({a.url}), vllm-b on node-2 ({b.url}) checked" in err


def test_a_whole_model_candidates_rollback_names_its_own_fleet_to_delete_and_unloads_nothing(fleet, tmp_path):
    """A full fine-tune's candidate has a fleet of its own (no adapter to unpublish or unload): the exit handler
    deletes the fleet `discarded` names; the champion, on its own fleet too, gets the traffic back."""
    candidate = FakeReplica(tmp_path / "adapters", loaded=[CANDIDATE])
    list_endpoints(tmp_path / "run", [("vllm-a", "node-1", candidate)])
    own = state(candidate.url, candidate_is_model=True, fleet="llama-lora-vllm-0badc0de",
                champion_vllm_url=closed_url(), champion_fleet="llama-lora-vllm-0c0ffee0")  # fmt: skip
    rollout.write_state(fleet["state_file"], own)
    out = finish_rollout.run(finish_rollout.Args.model_validate({**fleet, "workflow_status": "Failed"}))
    assert (out.phase, out.discarded, out.discards) == ("Degraded", "llama-lora-vllm-0badc0de", True)
    assert CANDIDATE in candidate.loaded and (tmp_path / "adapters" / CANDIDATE).exists()  # nothing unloaded
    weights = {slot: route["weight"] for slot, route in litellm_proxy.RoutesFile(
        tmp_path / "routes.json", MODEL).read()[MODEL].items()}  # fmt: skip
    assert weights == {litellm_proxy.slot_id(MODEL, "blue"): 100.0, litellm_proxy.slot_id(MODEL, "green"): 0.0}


def test_promote_names_a_whole_model_champions_own_fleet_to_retire_and_takes_its_slot_out_of_the_routes():
    """Only a champion on a fleet of its own (not the candidate's) is retired: adapters share one fleet."""
    shared = state("http://vllm:8000", champion_fleet=SERVICE)
    assert promote.retired_fleet(shared) == "" and promote.retired_fleet(state("http://vllm:8000")) == ""
    own = state("http://vllm:8000", champion_fleet="llama-lora-vllm-0c0ffee0")
    assert promote.retired_fleet(own) == "llama-lora-vllm-0c0ffee0"


def test_a_replica_the_rollback_cannot_ask_is_named_not_taken_as_clean(fleet, tmp_path):
    a, gone = (FakeReplica(tmp_path / "adapters", loaded=[CHAMPION, CANDIDATE]) for _ in range(2))
    gone.stop()
    list_endpoints(tmp_path / "run", [("vllm-a", "node-1", a), ("vllm-gone", "node-2", gone)])
    rollout.write_state(fleet["state_file"], state(a.url))
    out = finish_rollout.run(finish_rollout.Args.model_validate({**fleet, "workflow_status": "Failed"}))
    assert CANDIDATE not in a.loaded
    assert out.candidate_left_on.startswith(f"vllm-gone on node-2 ({gone.url}) (not checked: GET {gone.url}/v1/models")


def test_promote_loads_the_candidate_on_a_replica_that_joined_during_the_canary(fleet, tmp_path):
    a = FakeReplica(tmp_path / "adapters", loaded=[CHAMPION, CANDIDATE])
    joined = FakeReplica(tmp_path / "adapters", loaded=[CHAMPION])  # a replacement pod: it never served v2 yet
    list_endpoints(tmp_path / "run", [("vllm-a", "node-1", a), ("vllm-c", "node-3", joined)])
    rollout.write_state(fleet["state_file"], state(a.url, stage="analyze-100"))
    proxy = Proxy(litellm_proxy.slot_id(MODEL, "green"), litellm_proxy.slot_id(MODEL, "blue"))
    args = promote.Args.model_validate({**fleet, "proxy_url": proxy.url, "vllm_url": a.url, "fleet": SERVICE})
    assert promote.run(args).champion_version == "2"
    assert CANDIDATE in joined.loaded and joined.finished == 1  # loaded by a real generation before traffic moved


def test_loading_names_each_replica_that_did_not_load_the_adapter(tmp_path):
    a = FakeReplica(tmp_path / "adapters", loaded=[CANDIDATE])
    other = FakeReplica(tmp_path / "elsewhere")  # its resolver folder does not publish the adapter: it answers 404
    fleet = [Replica("vllm-a", "node-1", a.url), Replica("vllm-b", "node-2", other.url)]
    with pytest.raises(StepFailedError) as failed:
        replicas.load_on_every_replica(fleet, CANDIDATE, api_key="", prompt="p0", max_tokens=2, timeout_s=0)
    message = str(failed.value)
    assert message.startswith(f"{CANDIDATE} is not loaded on every ready replica: vllm-b on node-2 ({other.url}): ")
    assert "vllm-a" not in message


def test_the_local_fleets_endpoints_are_endpoint_slices_and_list_every_replica(tmp_path):
    endpoints = [
        Endpoint("vllm-b", "node-2", "198.18.0.3", 8000, ready=False),
        Endpoint("vllm-a", "node-1", "198.18.0.2", 8000, ready=True),
    ]
    document = fleet_endpoints.slice_list(SERVICE, "http", endpoints)
    for item in document["items"]:
        kubernetes_validate.validate(item, "1.32.0", strict=True)
    assert replicas.from_slices(document) == [
        Replica("vllm-a", "node-1", "http://198.18.0.2:8000", ready=True),
        Replica("vllm-b", "node-2", "http://198.18.0.3:8000", ready=False),
    ]


def test_an_endpoint_without_a_ready_condition_counts_as_ready_and_ipv6_is_bracketed():
    slices = {"items": [{"ports": [{"port": 8000}], "endpoints": [{"addresses": ["fd00::5"]}]}]}
    assert replicas.from_slices(slices) == [Replica("fd00::5", "", "http://[fd00::5]:8000", ready=True)]
    assert replicas.from_slices({"items": [{"ports": [], "endpoints": [{"addresses": ["10.0.0.1"]}]}]}) == []


class _Api(BaseHTTPRequestHandler):
    answer: tuple[int, bytes] = (200, b"{}")
    seen: list[tuple[str, str | None]] = []

    def do_GET(self) -> None:
        _Api.seen.append((self.path, self.headers.get("Authorization")))
        code, body = _Api.answer
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        """Quiet."""


@pytest.fixture
def api() -> Iterator[ApiAccess]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Api)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _Api.seen = []
    yield ApiAccess(f"http://127.0.0.1:{server.server_port}", "tok3n", "argo")
    server.shutdown()
    server.server_close()


def test_in_a_pod_the_endpoints_are_listed_by_the_kubernetes_api(api):
    endpoints = [Endpoint("vllm-a", "ip-10-0-1-5", "10.0.1.7", 8000, ready=True)]
    _Api.answer = (200, json.dumps(fleet_endpoints.slice_list(SERVICE, "http", endpoints)).encode())
    assert replicas.from_api(SERVICE, api) == [Replica("vllm-a", "ip-10-0-1-5", "http://10.0.1.7:8000")]
    query = f"labelSelector=kubernetes.io%2Fservice-name%3D{SERVICE}"
    assert _Api.seen == [(f"/apis/discovery.k8s.io/v1/namespaces/argo/endpointslices?{query}", "Bearer tok3n")]
    _Api.answer = (403, b'{"kind":"Status"}')
    with pytest.raises(StepFailedError, match="HTTP 403; grant the pipeline's Role `list` on endpointslices"):
        replicas.from_api(SERVICE, api)


def test_without_a_service_named_the_address_is_the_one_replica(monkeypatch):
    monkeypatch.setenv(RUN_DIR_ENV, "/nonexistent")
    assert replicas.replicas("", "http://127.0.0.1:8000/") == [Replica("", "", "http://127.0.0.1:8000")]


def test_the_pipelines_role_may_list_endpoint_slices():
    import yaml

    path = Path(__file__).resolve().parents[3] / "workflow-templates" / "cluster-prerequisites.yaml"
    (role,) = [d for d in yaml.safe_load_all(path.read_text()) if d["kind"] == "Role"]
    assert any(
        "discovery.k8s.io" in r["apiGroups"] and "endpointslices" in r["resources"] and "list" in r["verbs"]
        for r in role["rules"]
    )
