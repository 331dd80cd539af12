"""The rollout on a real vLLM engine (CPU build) and a real LiteLLM proxy, run from the compiled workflow.

One small adapter, the session's demo adapter (trained by the flagship's full run, or here when that did not
run: tests/e2e/conftest.py), with evaluate's report on it; the other versions are cheap derivatives of it: a
copy with a tiny perturbation of its LoRA weights (the same answers, another checkpoint digest, so another
version) and a copy with a large one (broken answers, registered with the good one's evaluation: what serving
catches when the registered artifact is not what was evaluated). Runs adopt the session's shared engine
(conftest.py). The tests build on each other in file order: v1 is champion, a canary promotes v2, v3 is rolled
back, and v4's rollout loses its engine (last: it kills the shared engine, which a later user restarts).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from eksflow.llm.steps.common import adapters, rollout, tracking, vllm_client
from tests.e2e.processes import serving_processes
from tests.e2e.rollouts import (
    MODEL,
    PROMPT,
    Run,
    demo_adapter_trained,
    outputs,
    published,
    register_versions,
)

pytestmark = pytest.mark.slow
TOLERANCE_SE = 4  # the stated routing tolerance: |share - weight| <= 4 binomial standard errors


@pytest.fixture(scope="module")
def trained(tmp_path_factory, model_cache, shared_engine, demo_adapter):
    """(adapter folder, evaluate's report on it): the session's demo adapter, trained here unless a run made it."""
    shared_engine.spawn()  # the engine loads while the adapter trains, as in a pipeline run
    return demo_adapter_trained(tmp_path_factory, model_cache, demo_adapter)


@pytest.fixture(scope="module")
def state(tmp_path_factory):
    """The local state folder every run of the module shares (its FSx volume holds the registry)."""
    return tmp_path_factory.mktemp("state")


@pytest.fixture(scope="module")
def registry(state, trained, tmp_path_factory):
    """v1 (champion, blue), v2 and v4 (tiny perturbations of v1), v3 (broken), each with evaluate's report."""
    return register_versions(state, *trained, tmp_path_factory.mktemp("adapters"))


def test_a_good_candidate_is_canaried_by_weight_and_promoted(state, model_cache, registry, adopt_engine):
    # The default tolerance (24, 64, 34 live requests): this test is what sees a LiteLLM upgrade break the weights
    # (a router that ignores them, sending all to one slot, is 8 standard errors off at 50 %).
    run = Run(state, model_cache, "2")
    result = run.finish()
    assert result.phase == "Succeeded", result.message
    # Pre-traffic: the probes straight to the candidate at weight 0, no live request, the routing rules left out.
    before = run.report(0)
    assert before["passed"] and before["live_traffic"] == {"requests": 0, "sized": before["live_traffic"]["sized"],
                                                           "served_by": {}}  # fmt: skip
    assert {r["metric"] for r in before["rules"]} == {"served_gap", "error_rate", "p95_latency_s", "score_vs_champion"}
    for percent, requests in ((10, 24), (50, 64), (100, 34)):
        report = run.report(percent)
        assert report["live_traffic"]["requests"] == requests, report["live_traffic"]
        assert report["live_traffic"]["sized"].startswith(f"{requests} live requests: "), report["live_traffic"]
        # Each model answers the probes once: the pre-traffic step asks both, the later ones reuse them (same
        # engine, adapters, prompts).
        for asked in (report["probes_asked"][role] for role in ("candidate", "champion")):
            fresh = (asked["sent"], asked["errors"], asked["reused_from"])
            assert fresh == (0, 0, "analyze-0"), (percent, asked)
        served_by = report["live_traffic"]["served_by"]
        assert set(served_by) <= {"llama-lora-blue", "llama-lora-green"}, served_by  # no failed request
        n = sum(served_by.values())
        share, weight = served_by.get("llama-lora-green", 0) / n, percent / 100
        tolerance = TOLERANCE_SE * math.sqrt(weight * (1 - weight) / n)
        assert abs(share - weight) <= tolerance, (percent, served_by)
        assert report["metrics"]["error_rate"] == 0.0 and report["metrics"]["served_gap"] <= 0.125
    assert str(tracking.alias_version(registry, MODEL, tracking.CHAMPION).version) == "2"
    assert str(tracking.alias_version(registry, MODEL, tracking.PREVIOUS).version) == "1"
    tags = rollout.version_tags(registry, MODEL, "2")
    assert tags[rollout.PHASE_TAG] == "Healthy" and tags[rollout.SLOT_TAG] == "green"
    # Served by name from the adapter folder: published once, resolved by the engine at its first request.
    candidate, champion = published(registry, "2"), published(registry, "1")
    assert outputs(run.node("load-candidate"))["adapter"] == candidate
    loaded = vllm_client.loaded_adapters(adopt_engine.url, api_key=adopt_engine.api_key)
    assert Path(loaded[candidate]) == adopt_engine.adapters_dir / candidate
    assert f"Resolved and loaded LoRA adapter '{candidate}'" in adopt_engine.log.read_text(errors="replace")
    assert (adopt_engine.adapters_dir / champion).is_dir()  # the former champion stays published: rollback's target
    routes = json.loads((state / "volumes" / "fsx-claim" / "serving" / MODEL / "routes.json").read_text())[MODEL]
    assert routes["llama-lora-green"]["adapter"] == candidate and routes["llama-lora-green"]["weight"] == 100
    assert routes["llama-lora-blue"]["adapter"] == champion and routes["llama-lora-blue"]["weight"] == 0


class Listener:
    """Whatever listens now on the port an earlier run's engine had: it records every request that reaches it."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str]] = []
        listener = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                listener.requests.append((self.path, self.headers.get("Authorization", "")))
                self.send_error(500)

            def log_message(self, *args: object) -> None:
                """Quiet."""

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def test_rolling_out_the_champions_own_version_rolls_nothing_out(state, model_cache, registry, adopt_engine):
    """A rerun on unchanged data registers the champion's version again: nothing is loaded, canaried or promoted,
    and `previous` still names the version before the champion. The routes file the earlier run left names a port
    where another process listens now: the run's proxy sends it nothing, and is not ready before serve-champion."""
    loaded = vllm_client.loaded_adapters(adopt_engine.url, api_key=adopt_engine.api_key)
    listener = Listener()
    left = json.loads((state / "volumes" / "fsx-claim" / "serving" / MODEL / "routes.json").read_text())
    for route in left[MODEL].values():
        route["api_base"] = f"{listener.url}/v1"
    (state / "volumes" / "fsx-claim" / "serving" / MODEL / "routes.json").write_text(json.dumps(left))
    run = Run(state, model_cache, "2")
    result = run.finish()
    listener.server.shutdown()
    assert result.phase == "Succeeded", result.message
    assert listener.requests == []  # no request, so never the run's vLLM key
    assert "started; not ready" in run.node("proxy")["message"], run.node("proxy")
    candidate = outputs(run.node("load-candidate"))
    assert candidate["rolls_out"] == "false" and candidate["candidate_slot"] == "", candidate
    log = (run.run_dir / "logs" / "load-candidate.log").read_text()
    assert "v2 is already the champion of 'llama-lora' (slot green): nothing to roll out" in log
    assert run.node("analyze-0")["phase"] == "Skipped"  # the pre-traffic step; every later step follows it
    left_out = [t for t in run_nodes(run) if t.startswith(("shift-", "analyze-")) or t == "promote"]
    left_out.remove("analyze-0")
    assert len(left_out) == 7 and {run.node(t)["phase"] for t in left_out} == {"Omitted"}, left_out
    assert outputs(run.node("onExit.finish-rollout"))["reason"] == "no candidate"
    assert str(tracking.alias_version(registry, MODEL, tracking.CHAMPION).version) == "2"
    assert str(tracking.alias_version(registry, MODEL, tracking.PREVIOUS).version) == "1"
    assert rollout.version_tags(registry, MODEL, "2")[rollout.PHASE_TAG] == "Healthy"
    assert vllm_client.loaded_adapters(adopt_engine.url, api_key=adopt_engine.api_key) == loaded


def run_nodes(run: Run) -> list[str]:
    return list(json.loads((run.run_dir / "status.json").read_text())["status"]["nodes"])


def test_a_candidate_failing_the_analysis_is_rolled_back_while_the_champion_answers(
    state, model_cache, registry, adopt_engine
):
    champion = published(registry, "2")
    answers: list[vllm_client.Answer] = []
    run = Run(state, model_cache, "3")

    def ask_the_champion() -> None:
        while run.thread.is_alive():
            answers.append(
                vllm_client.chat(adopt_engine.url, champion, PROMPT, api_key=adopt_engine.api_key, timeout_s=120)
            )
            time.sleep(0.5)

    asker = threading.Thread(target=ask_the_champion, daemon=True)
    run.wait_for("load-candidate", "Succeeded")
    asker.start()
    result = run.finish()
    asker.join(300)
    assert result.phase == "Failed"
    # Caught before any user: the pre-traffic analysis fails, no shift runs, no live request reaches it.
    analysis = run.node("analyze-0")
    assert analysis["phase"] == "Failed" and "served_gap" in analysis["message"], analysis
    assert {run.node(t)["phase"] for t in ("shift-10", "analyze-10", "shift-50", "promote")} == {"Omitted"}
    assert run.report(0)["live_traffic"]["requests"] == 0
    state_file = state / "volumes" / "fsx-claim" / "runs" / run.run_dir.name / "rollout" / "state.json"
    assert json.loads(state_file.read_text())["percent"] == 0.0  # its weight never left 0
    finished = outputs(run.node("onExit.finish-rollout"))
    assert finished["phase"] == "Degraded" and finished["champion_serving"] == "true"
    # RO1: champion unchanged, answering during the analysis and after it.
    assert str(tracking.alias_version(registry, MODEL, tracking.CHAMPION).version) == "2"
    assert answers and all(a.ok for a in answers), [a for a in answers if not a.ok]
    assert vllm_client.chat(adopt_engine.url, champion, PROMPT, api_key=adopt_engine.api_key).ok
    tags = rollout.version_tags(registry, MODEL, "3")
    assert tags[rollout.PHASE_TAG] == "Degraded" and "served_gap" in tags[rollout.REASON_TAG]
    loaded = vllm_client.loaded_adapters(adopt_engine.url, api_key=adopt_engine.api_key)
    candidate = published(registry, "3")
    assert champion in loaded and candidate not in loaded  # the candidate was dropped from the engine
    assert not (adopt_engine.adapters_dir / candidate).exists()  # and unpublished: no engine resolves it again


def test_the_engine_serves_a_published_adapter_by_name_and_refuses_one_for_another_base(registry, adopt_engine):
    """The fleet's adapter folder on the real engine: publishing is all it takes (no load call), an adapter whose
    config names another base model is refused, and unpublishing removes it."""
    url, key, folder = adopt_engine.url, adopt_engine.api_key, adopt_engine.adapters_dir
    root = str((vllm_client.base_model_card(url, api_key=key) or {})["root"])
    name = adapters.publish(registry, MODEL, "4", folder, lambda: root, lambda adapter: None)
    assert name not in vllm_client.loaded_adapters(url, api_key=key)  # published only
    assert vllm_client.chat(url, name, PROMPT, api_key=key).ok
    assert f"Resolved and loaded LoRA adapter '{name}'" in adopt_engine.log.read_text(errors="replace")
    other = folder / f"{MODEL}-other-base"
    shutil.copytree(folder / name, other)
    adapter_config = json.loads((other / "adapter_config.json").read_text())
    (other / "adapter_config.json").write_text(json.dumps({**adapter_config, "base_model_name_or_path": "/models/x"}))
    assert vllm_client.chat(url, other.name, PROMPT, api_key=key).status == 404
    assert adapters.unpublish(folder, name) and adapters.unpublish(folder, other.name)
    assert vllm_client.unload_adapter(url, name, api_key=key)  # what finish-rollout does on the engine in reach
    assert vllm_client.chat(url, name, PROMPT, api_key=key).status == 404
    assert not [p for p in folder.iterdir() if p.name.startswith(".")]  # nothing half-published left behind


def test_a_killed_engine_fails_the_rollout_promotes_nothing_and_leaves_no_process(
    state, model_cache, registry, adopt_engine
):
    """RO2. Last in the module: it kills the shared engine (conftest restarts it for any later user)."""
    before = serving_processes()
    run = Run(state, model_cache, "4", "canary.share_tolerance=0.06")  # 400 live requests at 10 %: still sending
    run.wait_for("analyze-10", "Running")
    time.sleep(2)  # the analysis is sending its traffic
    engine = adopt_engine.process
    assert engine is not None
    os.killpg(engine.pid, signal.SIGKILL)
    result = run.finish()
    assert result.phase == "Failed"
    analysis = run.node("analyze-10")
    assert analysis["phase"] == "Failed" and run.node("promote")["phase"] == "Omitted"
    assert "does not answer" in analysis["message"], analysis  # the engine's death is named, not just its effects
    assert outputs(run.node("onExit.finish-rollout"))["champion_serving"] == "false"  # it shared the dead engine
    assert str(tracking.alias_version(registry, MODEL, tracking.CHAMPION).version) == "2"
    assert rollout.version_tags(registry, MODEL, "4")[rollout.PHASE_TAG] == "Degraded"
    engine.wait(60)
    time.sleep(2)  # the engine's orphaned workers notice their parent is gone
    assert serving_processes() <= before and not serving_processes() & set(_group(engine.pid)), "processes left"


def _group(pgid: int) -> list[int]:
    """Pids still in process group `pgid`."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid:
            found.append(int(stat.parent.name))
    return found
