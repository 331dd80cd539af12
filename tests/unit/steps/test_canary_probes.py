"""Probe answers asked once per model and reused across canary steps while nothing they depend on changed."""

import json
import math
from pathlib import Path

import pytest

from eksflow.llm.steps import canary
from eksflow.llm.steps.canary import analysis, traffic
from eksflow.llm.steps.canary import report as canary_report
from eksflow.llm.steps.common import probe_cache, vllm, vllm_client
from eksflow.llm.steps.common.rollout import RolloutState
from eksflow.llm.steps.common.vllm_client import Answer
from eksflow.llm.steps.evaluate.metrics import exact_match

STATE = RolloutState(
    champion_version="1",
    champion_slot="blue",
    champion_adapter="llama-lora-v1-aaaaaaaa",
    candidate_version="2",
    candidate_slot="green",
    candidate_adapter="llama-lora-v2-bbbbbbbb",
)


class Engine:
    """A fake vLLM engine: its models list, its finished-request counter, and the chat requests it got."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.adapters = {}
        for name, version in ((STATE.champion_adapter, "1"), (STATE.candidate_adapter, "2")):
            folder = tmp_path / "adapters" / name
            folder.mkdir(parents=True)
            (folder / "adapter_config.json").write_text("{}")
            (folder / "adapter_model.safetensors").write_bytes(f"weights of v{version}".encode())
            self.adapters[name] = str(folder)
        self.finished = 100.0
        self.asked: list[str] = []
        self.failing = False
        monkeypatch.setattr(vllm_client, "base_model_card", lambda url, api_key="": {"id": "base", "root": "/m"})
        monkeypatch.setattr(vllm_client, "loaded_adapters", lambda url, api_key="": dict(self.adapters))
        monkeypatch.setattr(vllm_client, "metrics_text", self.metrics)
        monkeypatch.setattr(vllm_client, "chat", self.chat)

    def metrics(self, url: str, api_key: str = "") -> str:
        half = self.finished / 2
        return (
            "# TYPE vllm:request_success_total counter\n"
            f'vllm:request_success_total{{engine="0",finished_reason="stop",model_name="base"}} {half}\n'
            f'vllm:request_success_total{{engine="0",finished_reason="length",model_name="base"}} {half}\n'
        )

    def chat(self, url: str, model: str, prompt: str, **kwargs: object) -> Answer:
        self.asked.append(model)
        if self.failing:
            return Answer(0, "", 1.0, error="timeout")
        self.finished += 1
        return Answer(200, f"{model} says {prompt}", 0.1)

    def restart(self) -> None:
        self.finished = 3.0  # a new engine counts from 0; adapters reloaded from the same folders


def step(
    tmp_path: Path, percent: float = 10, prompts: tuple[str, ...] = ("p0", "p1", "p2"), **extra
) -> tuple[dict[str, traffic.Asked], list[traffic.Probe]]:
    args = canary.Args.model_validate(
        {
            "model_name": "llama-lora",
            "tracking_uri": "sqlite:///x.db",
            "vllm_url": "http://127.0.0.1:1",
            "proxy_url": "http://127.0.0.1:2",
            "serving_dir": tmp_path / "adapters",
            "routes_file": tmp_path / "routes.json",
            "state_file": tmp_path / "rollout" / "state.json",
            "secrets_dir": tmp_path / "secrets",
            "percent": percent,
            "report_dir": tmp_path / "reports",
            **extra,
        }
    )
    probes = [traffic.Probe(prompt=p, reference=f"llama-lora-v2-bbbbbbbb says {p}", evaluated=1.0) for p in prompts]
    return traffic.send_probes(args, STATE, probes, exact_match), probes


def test_each_model_answers_once_and_later_steps_reuse_its_answers(tmp_path, monkeypatch):
    engine = Engine(tmp_path, monkeypatch)
    first, _ = step(tmp_path, 10)
    assert first == {"candidate": traffic.Asked(3, 0), "champion": traffic.Asked(3, 0)} and len(engine.asked) == 6
    again, probes = step(tmp_path, 50)
    assert len(engine.asked) == 6, "nothing changed: no probe is sent again"
    assert again == {"candidate": traffic.Asked(0, 0, "analyze-10"), "champion": traffic.Asked(0, 0, "analyze-10")}
    assert [p.candidate_score for p in probes] == [1.0, 1.0, 1.0]  # scored from the kept answers, as when sent
    assert probes[0].champion == "llama-lora-v1-aaaaaaaa says p0"
    assert canary_report.describe_asked(again) == "candidate reused from analyze-10, champion reused from analyze-10"
    assert not list((tmp_path / "rollout").glob(".*tmp"))  # written in one rename


def test_the_pre_traffic_step_always_asks_and_times_the_candidate_and_later_steps_reuse_it(tmp_path, monkeypatch):
    engine = Engine(tmp_path, monkeypatch)
    step(tmp_path, 0)
    resumed, probes = step(tmp_path, 0)  # a resumed analyze-0 measures again: it is the gate before any user
    assert resumed == {"candidate": traffic.Asked(3, 0), "champion": traffic.Asked(3, 0)} and len(engine.asked) == 12
    assert [p.candidate_latency_s for p in probes] == [0.1, 0.1, 0.1]
    later, probes = step(tmp_path, 10)
    assert later == {"candidate": traffic.Asked(0, 0, "analyze-0"), "champion": traffic.Asked(0, 0, "analyze-0")}
    assert all(math.isnan(p.candidate_latency_s) for p in probes)  # not asked by this step


@pytest.mark.parametrize(
    "change",
    [
        "restart",  # the same adapters reloaded into a new engine
        "reloaded elsewhere",  # the candidate's name now serves another folder
        "other weights",  # the files behind the candidate's folder changed
        "other prompts",
        "other answer cap",
    ],
)
def test_a_change_the_answers_depend_on_asks_the_candidate_again(tmp_path, monkeypatch, change):
    engine = Engine(tmp_path, monkeypatch)
    step(tmp_path, 10)
    green = Path(engine.adapters["llama-lora-v2-bbbbbbbb"])
    extra: dict[str, object] = {}
    prompts = ("p0", "p1", "p2")
    if change == "restart":
        engine.restart()
    elif change == "reloaded elsewhere":
        other = tmp_path / "elsewhere"
        other.mkdir()
        for f in green.iterdir():
            (other / f.name).write_bytes(f.read_bytes())
        engine.adapters["llama-lora-v2-bbbbbbbb"] = str(other)
    elif change == "other weights":
        (green / "adapter_model.safetensors").write_bytes(b"retrained")
    elif change == "other prompts":
        prompts = ("p0", "p1", "q2")
    else:
        extra["max_new_tokens"] = 64
    engine.asked.clear()
    asked, _ = step(tmp_path, 50, prompts, **extra)
    assert asked["candidate"] == traffic.Asked(3, 0), change
    assert "llama-lora-v2-bbbbbbbb" in engine.asked


def test_failed_answers_are_never_kept(tmp_path, monkeypatch):
    engine = Engine(tmp_path, monkeypatch)
    engine.failing = True
    first, probes = step(tmp_path, 10)
    assert first["candidate"] == traffic.Asked(3, 3) and probes[0].candidate.startswith("<error")
    assert not probe_cache.cache_path(tmp_path / "rollout" / "state.json").exists()
    engine.failing = False
    again, _ = step(tmp_path, 50)
    assert again["candidate"] == traffic.Asked(3, 0)


def test_an_unreadable_engine_means_no_reuse_and_nothing_kept(tmp_path, monkeypatch):
    engine = Engine(tmp_path, monkeypatch)

    def down(url: str, api_key: str = "") -> str:
        raise vllm.ServingError("GET /metrics failed")

    monkeypatch.setattr(vllm_client, "metrics_text", down)
    step(tmp_path, 10)
    step(tmp_path, 50)
    assert len(engine.asked) == 12
    assert not probe_cache.cache_path(tmp_path / "rollout" / "state.json").exists()


def test_a_corrupt_cache_is_ignored_with_a_note_then_replaced(tmp_path, monkeypatch, capsys):
    engine = Engine(tmp_path, monkeypatch)
    cache = probe_cache.cache_path(tmp_path / "rollout" / "state.json")
    cache.parent.mkdir(parents=True)
    cache.write_text('{"entries": [{"key": ')  # half a file
    asked, _ = step(tmp_path, 10)
    assert asked["candidate"] == traffic.Asked(3, 0) and len(engine.asked) == 6
    assert "ignoring the probe answers" in capsys.readouterr().err
    assert {e["step"] for e in json.loads(cache.read_text())["entries"]} == {"analyze-10"}


def test_reused_probes_are_no_requests_in_error_rate(tmp_path):
    a = canary.Args.model_validate(
        {
            "model_name": "llama-lora",
            "tracking_uri": "sqlite:///x.db",
            "vllm_url": "",
            "proxy_url": "",
            "serving_dir": tmp_path,
            "routes_file": tmp_path / "routes.json",
            "state_file": tmp_path / "state.json",
            "percent": 50,
            "report_dir": tmp_path,
        }
    )
    state = STATE.model_copy(update={"percent": 50})
    probes = [traffic.Probe(prompt="p", reference="r", evaluated=1.0, candidate_score=1.0, champion_score=1.0)] * 4
    live = [Answer(200, "ok", 0.1, "llama-lora-green"), Answer(0, "", 9.0, error="timeout")] * 10
    reused = {"candidate": traffic.Asked(0, 0, "analyze-10"), "champion": traffic.Asked(0, 0, "analyze-10")}
    metrics = analysis.analyse(a, state, live, probes, reused)
    assert metrics["error_rate"] == 0.5  # 10 failed of the 20 live requests: the kept answers are not requests
    assert metrics["champion_error_rate"] == 0.0
    sent = {"candidate": traffic.Asked(4, 0), "champion": traffic.Asked(4, 2)}
    metrics = analysis.analyse(a, state, live, probes, sent)
    assert metrics["error_rate"] == pytest.approx(10 / 24) and metrics["champion_error_rate"] == 0.5


def test_a_conversations_answers_are_keyed_by_its_whole_history_and_a_pairs_key_is_unchanged(tmp_path, monkeypatch):
    import hashlib

    Engine(tmp_path, monkeypatch)
    history = [
        {"role": "user", "content": "p0"},
        {"role": "assistant", "content": "a"},
        {"role": "user", "content": "b"},
    ]
    shown = "user: p0\nassistant: a\nuser: b"  # the prompt a report shows: the same for both histories below

    def key(probe: traffic.Probe) -> str:
        found = probe_cache.model_key("http://127.0.0.1:1", "", STATE.candidate_adapter, "2", [probe.asked()], 16)
        assert found is not None
        return found.prompts_digest

    earlier = [{**history[0], "content": "p1"}, *history[1:]]
    conversation = traffic.Probe(prompt=shown, messages=history, reference="r", evaluated=1.0)
    assert conversation.asked() == history
    assert key(conversation) != key(conversation.model_copy(update={"messages": earlier}))
    pair = traffic.Probe(prompt="p0", reference="r", evaluated=1.0)
    assert key(pair) == hashlib.sha256(json.dumps(["p0"]).encode()).hexdigest()  # as before: kept answers still match
