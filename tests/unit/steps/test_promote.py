"""`champion` moves only by compare-and-set (RO4); `rollback` puts `previous` back. Real sqlite registry."""

import json
from http.server import BaseHTTPRequestHandler

import pytest

from eksflow.llm.steps import promote, rollback
from eksflow.llm.steps.common import litellm_proxy, rollout, tracking
from eksflow.runtime.args import StepFailedError
from tests.unit.steps.fake_fleet import json_server

MODEL = "llama-lora"


@pytest.fixture
def registry(tmp_path):
    """Versions 1-3 of the model (sources need not exist: these tests only move aliases)."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = tracking.client(uri)
    client.create_registered_model(MODEL)
    for _ in range(3):
        client.create_model_version(MODEL, f"file://{tmp_path}/adapter")
    return uri


def aliases(uri):
    found = {}
    for alias in (tracking.CHAMPION, tracking.PREVIOUS):
        version = tracking.alias_version(uri, MODEL, alias)
        found[alias] = None if version is None else str(version.version)
    return found


def test_a_promotion_compared_with_the_current_champion_moves_it(registry):
    tracking.promote(registry, MODEL, "1")
    promote.compare_and_set(registry, MODEL, expected="1", candidate="3")
    assert aliases(registry) == {"champion": "3", "previous": "1"}


def test_a_champion_moved_by_another_rollout_is_never_overwritten(registry):
    tracking.promote(registry, MODEL, "1")
    tracking.promote(registry, MODEL, "2")  # an overlapping run promoted v2 while v3 was being canaried against v1
    with pytest.raises(StepFailedError, match=r"moved from v1 to v2 while this rollout ran.*\(RO4\)"):
        promote.compare_and_set(registry, MODEL, expected="1", candidate="3")
    assert aliases(registry) == {"champion": "2", "previous": "1"}


def test_a_first_promotion_expects_no_champion(registry):
    promote.compare_and_set(registry, MODEL, expected="", candidate="1")
    assert aliases(registry) == {"champion": "1", "previous": None}
    with pytest.raises(StepFailedError, match="moved from vunset to v1"):
        promote.compare_and_set(registry, MODEL, expected="", candidate="2")


def test_rollback_puts_previous_back_and_keeps_the_bad_one_as_previous(registry, tmp_path, capsys):
    tracking.promote(registry, MODEL, "1")
    tracking.promote(registry, MODEL, "2")
    argv = [f"--model-name={MODEL}", f"--tracking-uri={registry}", f"--outputs-dir={tmp_path / 'out'}"]
    assert rollback.main(argv) == 0
    assert aliases(registry) == {"champion": "1", "previous": "2"}
    assert tracking.client(registry).get_model_version(MODEL, "2").tags["rollout.phase"] == "RolledBack"
    assert "moving the aliases only" in capsys.readouterr().err


def test_rollback_without_previous_is_bad_input(registry, tmp_path, capsys):
    argv = [f"--model-name={MODEL}", f"--tracking-uri={registry}", f"--outputs-dir={tmp_path / 'out'}"]
    assert rollback.main(argv) == 2
    assert "no version holds alias `previous`" in capsys.readouterr().err


class Server:
    """An OpenAI-style server: the fleet's one replica (its models list holds the candidate's adapter), or the
    public name's proxy (each answer from the candidate's slot, as LiteLLM's header says). Records the messages."""

    def __init__(self, header: dict[str, str]) -> None:
        self.asked: list[list[dict]] = []
        self.header = header
        self.server, self.url = json_server(self._handle)

    def _handle(self, request: BaseHTTPRequestHandler, method: str, body: dict) -> tuple[int, dict, dict[str, str]]:
        if method == "GET":
            cards = [{"id": "base", "root": "/models/base"}, {"id": ADAPTER, "parent": "base", "root": "/a"}]
            return 200, {"data": cards} if request.path == "/v1/models" else {}, self.header
        if request.path != "/v1/chat/completions":
            return 200, {}, self.header
        self.asked.append(body["messages"])
        prompt = body["messages"][-1]["content"]
        return 200, {"choices": [{"message": {"role": "assistant", "content": f"to {prompt}"}}]}, self.header


ADAPTER = "llama-lora-v2-bbbbbbbb"


HISTORY = [
    {"role": "system", "content": "Answer in SQL."},
    {"role": "user", "content": "How many orders are there?"},
    {"role": "assistant", "content": "SELECT count(*) FROM orders"},
    {"role": "user", "content": "How many orders did Ada place?"},
]


@pytest.mark.parametrize(
    "evaluated", ["pair", "conversation", ""], ids=["held-out-row", "held-out-conversation", "no-evaluation-report"]
)
def test_promote_shows_the_answer_to_a_held_out_row_of_the_task_or_nothing(tmp_path, evaluated):
    """A text-to-SQL run's summary showed `answer = Hello.` (a generic prompt no doc names): the answer shown is the
    new champion's, through the public name, to the first held-out row evaluate scored; without one, nothing. A
    conversation's row is asked with the whole history evaluate asked it with."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = tracking.client(uri)
    experiment = client.create_experiment("rollout", artifact_location=(tmp_path / "artifacts").as_uri())
    report = tmp_path / "eval_report.json"
    rows = [{"prompt": "How many orders did Ada place?", "reference": "SELECT count(*) FROM orders", "same_rows": 1}]
    if evaluated == "conversation":
        rows[0] |= {"prompt": "system: Answer in SQL.\nuser: ...", "messages": HISTORY}
    report.write_text(json.dumps({"rows": rows, "task_metrics": ["same_rows"]}))
    client.create_registered_model(MODEL)
    for _ in range(2):
        run_id = client.create_run(experiment).info.run_id
        if evaluated:
            assert tracking.log_files(uri, run_id, [report], "eval")
        client.create_model_version(MODEL, f"runs:/{run_id}/adapter", run_id=run_id)
    tracking.promote(uri, MODEL, "1")
    state = rollout.RolloutState(champion_version="1", champion_slot="blue", candidate_version="2",
                                 candidate_slot="green", candidate_adapter=ADAPTER, stage="analyze-100")  # fmt: skip
    rollout.write_state(tmp_path / "state.json", state)
    engine, proxy = Server({}), Server({"x-litellm-model-id": litellm_proxy.slot_id(MODEL, "green")})
    routes = litellm_proxy.RoutesFile(tmp_path / "routes.json", MODEL)
    routes.assign("blue", "llama-lora-v1-aaaaaaaa", engine.url)
    routes.assign("green", ADAPTER, engine.url)
    try:
        argv = [f"--model-name={MODEL}", f"--tracking-uri={uri}", f"--vllm-url={engine.url}",
                f"--proxy-url={proxy.url}", f"--serving-dir={tmp_path / 'adapters'}",
                f"--routes-file={tmp_path / 'routes.json'}", f"--state-file={tmp_path / 'state.json'}",
                f"--secrets-dir={tmp_path / 'secrets'}", f"--outputs-dir={tmp_path / 'out'}"]  # fmt: skip
        assert promote.main(argv) == 0
    finally:
        engine.server.shutdown()
        proxy.server.shutdown()
    assert aliases(uri) == {"champion": "2", "previous": "1"}
    answer = (tmp_path / "out" / "answer").read_text()
    if evaluated:
        asked = (
            HISTORY if evaluated == "conversation" else [{"role": "user", "content": "How many orders did Ada place?"}]
        )
        assert proxy.asked == [asked]
        assert engine.asked[0] == asked  # load-candidate's check on each replica asks the same row
        assert answer == "to How many orders did Ada place?"
    else:
        assert answer == ""  # the readiness prompt proved the public name answers; its answer is not the task's
