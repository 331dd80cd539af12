"""The routes file: what the proxy's callback routes by (only this fleet's engines; the last good routes when the file
is damaged, one log line per problem), what the steps write (bad weights refused), and the proxy's readiness."""

import json
import math
import os
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from eksflow.llm.steps.common import litellm_proxy, litellm_routes
from eksflow.llm.steps.common.fleet_names import fleet_addresses, fleet_name, service_url
from eksflow.llm.steps.common.litellm_routes import Routes

ENGINE = "http://127.0.0.1:41000"
ALLOWED = re.escape(ENGINE)
GOOD = {
    "m": {
        "m-blue": {"weight": 100.0, "adapter": "m-v1-aaaaaaaa", "api_base": f"{ENGINE}/v1"},
        "m-green": {"weight": 0.0},
    }
}
DAMAGED = {
    "truncated": json.dumps(GOOD)[:40],
    "empty": "",
    "list": "[1, 2]",
    "null-group": '{"m": null}',
    "null-slot": '{"m": {"m-blue": null}}',
    "weight-text": '{"m": {"m-blue": {"weight": "abc", "adapter": "a", "api_base": "http://127.0.0.1:41000/v1"}}}',
    "weight-nan": '{"m": {"m-blue": {"weight": NaN, "adapter": "a", "api_base": "http://127.0.0.1:41000/v1"}}}',
    "weight-infinite": '{"m": {"m-blue": {"weight": 1e999, "adapter": "a", "api_base": "http://127.0.0.1:41000/v1"}}}',
    "weight-negative": '{"m": {"m-blue": {"weight": -5, "adapter": "a", "api_base": "http://127.0.0.1:41000/v1"}}}',
    "weight-boolean": '{"m": {"m-blue": {"weight": true, "adapter": "a", "api_base": "http://127.0.0.1:41000/v1"}}}',
    "weight-missing": '{"m": {"m-blue": {"adapter": "a", "api_base": "http://127.0.0.1:41000/v1"}}}',
    "weight-unassigned": '{"m": {"m-blue": {"weight": 5}}}',
    "address-not-http": '{"m": {"m-blue": {"weight": 5, "adapter": "a", "api_base": "file:///etc/passwd"}}}',
    "not-utf8": b'{"m": "\xff"}',
}


def write(path: Path, content: str | bytes | dict) -> None:
    """Replace the file in one rename, as the steps do (a new inode: the reader sees the change)."""
    tmp = path.with_name(".routes.tmp")
    if isinstance(content, bytes):
        tmp.write_bytes(content)
    else:
        tmp.write_text(content if isinstance(content, str) else json.dumps(content))
    os.replace(tmp, path)


def reader(path: Path, upstreams: str = ALLOWED) -> tuple[Routes, list[str]]:
    said: list[str] = []
    return Routes(str(path), upstreams, said.append), said


@pytest.mark.parametrize("text", list(DAMAGED.values()), ids=list(DAMAGED))
def test_a_damaged_file_keeps_the_last_good_routes_and_is_said_once(tmp_path, text):
    path = tmp_path / "routes.json"
    write(path, GOOD)
    routes, said = reader(path)
    good = routes.refresh()
    assert good.weights == {"m": {"m-blue": 100.0}} and good.targets == {"m-blue": ("m-v1-aaaaaaaa", f"{ENGINE}/v1")}
    write(path, text)
    for _ in range(50):  # a request flood: one line, not fifty
        current = routes.refresh()
        assert current.weights == good.weights and current.targets == good.targets
    assert len(said) == 1 and said[0].startswith(f"routes file {path} is damaged ("), said
    assert said[0].endswith("routing by the last good routes") and "\n" not in said[0]
    with pytest.raises(litellm_proxy.RoutingError, match=r"is damaged .*delete it to start over|is unreadable"):
        litellm_proxy.RoutesFile(path, "m").read()  # the writer refuses it too, in one line
    write(path, GOOD)
    assert routes.refresh().weights == good.weights and len(said) == 1  # good again: nothing to say


def test_a_folder_in_place_of_the_file_keeps_the_routes_and_is_said_once(tmp_path):
    path = tmp_path / "routes.json"
    write(path, GOOD)
    routes, said = reader(path)
    routes.refresh()
    path.unlink()
    path.mkdir()
    assert [routes.refresh().weights for _ in range(5)] == [{"m": {"m-blue": 100.0}}] * 5
    assert said == [f"routes file {path} is damaged (Is a directory); routing by the last good routes"]
    with pytest.raises(litellm_proxy.RoutingError, match="is unreadable"):
        litellm_proxy.RoutesFile(path, "m").set_weights({"m-blue": 100.0})


def test_damage_before_any_good_read_routes_nothing(tmp_path):
    path = tmp_path / "routes.json"
    write(path, "{")
    routes, said = reader(path)
    assert routes.refresh().weights == {} and routes.damaged
    assert said[0].endswith("routing by nothing (no good routes read yet)")


def test_two_different_problems_are_two_lines(tmp_path):
    path = tmp_path / "routes.json"
    write(path, GOOD)
    routes, said = reader(path)
    routes.refresh()
    for text in ("[]", "[]", '{"m": 1}', '{"m": 1}'):
        write(path, text)
        routes.refresh()
    assert len(said) == 2 and "a JSON list" in said[0] and "'m' holds a JSON number" in said[1]


@pytest.mark.parametrize(
    ("api_base", "said"),
    [
        ("http://127.0.0.1:41001/v1", "not an engine of this fleet"),  # an earlier run's engine: another port
        ("http://127.0.0.1:410001/v1", "not an engine of this fleet"),
        ("http://127.0.0.1:41000.evil.example/v1", "not an engine of this fleet"),
        ("https://127.0.0.1:41000/v1", "not an engine of this fleet"),
        ("http://localhost:41000/v1", "not an engine of this fleet"),
        ("http://127.0.0.1:41000@evil.example/v1", "is damaged"),  # a user part: the host is evil.example
        ("http://127.0.0.1:41000\\@evil.example/v1", "is damaged"),
        ("http://127.0.0.1:41000 /v1", "is damaged"),
    ],
    ids=["other-port", "longer-port", "longer-host", "other-scheme", "other-name", "user-part", "backslash", "space"],
)
def test_a_slot_outside_the_fleet_is_never_routed_and_is_said_once(tmp_path, api_base, said):
    path = tmp_path / "routes.json"
    write(path, {"m": {"m-blue": {"weight": 100.0, "adapter": "a", "api_base": api_base}}})
    routes, lines = reader(path)
    for _ in range(5):
        current = routes.refresh()
        assert current.weights == {} and current.targets == {}  # nothing to send to, so no key goes there
    assert len(lines) == 1 and said in lines[0], lines


def test_a_refused_slot_leaves_the_fleets_own_slot_routed(tmp_path):
    path = tmp_path / "routes.json"
    stale = {"weight": 0.0, "adapter": "old", "api_base": "http://127.0.0.1:41001/v1"}
    write(path, {"m": {**GOOD["m"], "m-green": stale}})
    current = reader(path)[0].refresh()
    assert current.weights == {"m": {"m-blue": 100.0}} and set(current.targets) == {"m-blue"}


@pytest.mark.parametrize("upstreams", ["", "(["], ids=["unset", "no-regex"])
def test_without_a_valid_pattern_of_engines_nothing_is_routed(tmp_path, upstreams):
    path = tmp_path / "routes.json"
    write(path, GOOD)
    routes, said = reader(path, upstreams)
    assert routes.refresh().weights == {}
    assert "nothing is routed" in said[0]


def test_no_file_routes_nothing_and_says_so_once(tmp_path):
    routes, said = reader(tmp_path / "routes.json")
    assert [routes.refresh().weights for _ in range(3)] == [{}] * 3
    assert len(said) == 1 and "no routes file" in said[0]


@pytest.mark.parametrize(
    "weight",
    [math.nan, math.inf, -1.0, "abc", True, None],
    ids=["nan", "infinite", "negative", "text", "boolean", "none"],
)
def test_the_writer_refuses_a_bad_weight_and_leaves_the_file_as_it_was(tmp_path, weight):
    routes = litellm_proxy.RoutesFile(tmp_path / "routes.json", "m")
    routes.assign("blue", "m-v1-aaaaaaaa", ENGINE)
    routes.set_weights({"m-blue": 100.0})
    before = routes.path.read_bytes()
    with pytest.raises(litellm_proxy.RoutingError, match="a weight is a finite number >= 0"):
        routes.set_weights({"m-blue": weight, "m-green": 0.0})
    assert routes.path.read_bytes() == before


def test_the_writer_refuses_a_slot_of_another_name_and_an_address_that_is_none(tmp_path):
    routes = litellm_proxy.RoutesFile(tmp_path / "routes.json", "m")
    with pytest.raises(litellm_proxy.RoutingError, match="the slots of m are"):
        routes.set_weights({"other-blue": 100.0})
    with pytest.raises(litellm_proxy.RoutingError, match="no http"):
        routes.assign("blue", "m-v1-aaaaaaaa", "127.0.0.1:41000")
    assert not routes.path.exists()


def test_a_new_assignment_starts_at_weight_0_and_the_same_one_keeps_its_weight(tmp_path):
    routes = litellm_proxy.RoutesFile(tmp_path / "routes.json", "m")
    routes.assign("blue", "m-v1-aaaaaaaa", ENGINE)
    routes.set_weights({"m-blue": 100.0, "m-green": 0.0})
    routes.assign("blue", "m-v1-aaaaaaaa", f"{ENGINE}/")  # serve-champion again: no dip in its traffic
    assert routes.read()["m"]["m-blue"]["weight"] == 100.0
    routes.assign("blue", "m-v1-aaaaaaaa", "http://127.0.0.1:41002")  # the same adapter on another engine
    assert routes.read()["m"]["m-blue"]["weight"] == 0.0
    routes.set_weights({"m-blue": 100.0})
    routes.assign("blue", "m-v2-bbbbbbbb", ENGINE)  # a weight left behind never sends users to a new adapter
    assert routes.read()["m"]["m-blue"]["weight"] == 0.0


def test_withdrawing_the_only_routed_slot_leaves_the_name_unrouted(tmp_path):
    routes = litellm_proxy.RoutesFile(tmp_path / "routes.json", "m")
    routes.withdraw("blue")  # nothing to withdraw: no file written
    assert not routes.path.exists()
    routes.assign("blue", "m-v1-aaaaaaaa", ENGINE)
    routes.set_weights({"m-blue": 100.0})
    routes.withdraw("blue")
    assert routes.read()["m"]["m-blue"]["weight"] == 0.0
    assert litellm_routes.unrouted("m", str(routes.path), ALLOWED) == (
        "no slot of 'm' on this fleet's engines has weight",
        False,
    )


def test_the_proxy_of_a_pipeline_may_reach_each_of_its_fleets_and_nothing_else():
    allowed = re.compile(fleet_addresses("llama-lora", "argo", 8000))
    for base_model in ("smollm2-135m-instruct", "s3://bucket/models/llama-3-8b"):
        assert allowed.fullmatch(service_url(fleet_name("llama-lora", base_model), "argo", 8000))
    for other in [
        service_url(fleet_name("other", "smollm2-135m-instruct"), "argo", 8000),
        service_url(fleet_name("llama-lora", "x"), "default", 8000),
        service_url(fleet_name("llama-lora", "x"), "argo", 8001),
        service_url(fleet_name("llama-lora", "x"), "argo", 8000) + ".evil.example",
        "http://llama-lora-vllm-zzzzzzzz.argo.svc.cluster.local:8000",
    ]:
        assert not allowed.fullmatch(litellm_routes.origin(f"{other}/v1")), other


class Liveness:
    """LiteLLM's /health/readiness as the probe sees it: 200, or another status."""

    def __init__(self, status: int) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(status)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                """Quiet."""

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def test_the_readiness_probe_needs_a_live_proxy_and_a_route_and_keeps_its_verdict_through_damage(tmp_path):
    path, verdict = tmp_path / "routes.json", tmp_path / "verdict"
    live, dead = Liveness(200), Liveness(503)
    try:

        def not_ready(port: int = live.port) -> str:
            return litellm_routes.not_ready("m", port, str(path), ALLOWED, verdict)

        assert "no routes file" in not_ready()
        write(path, {"m": {"m-blue": {"weight": 100.0, "adapter": "old", "api_base": "http://127.0.0.1:41001/v1"}}})
        assert "not an engine of this fleet" in not_ready()  # an earlier run's routes: not ready
        write(path, "{")
        assert "is damaged" in not_ready()  # no good routes read yet
        write(path, GOOD)
        assert not_ready() == "" and verdict.is_file()
        assert not_ready(dead.port) == "LiteLLM answers /health/readiness with 503"
        write(path, "{")
        assert not_ready() == ""  # the proxy keeps routing by the last good routes, so it stays ready
        litellm_proxy.RoutesFile(path, "m").path.unlink()
        assert "no routes file" in not_ready() and not verdict.exists()
    finally:
        live.server.shutdown()
        dead.server.shutdown()
