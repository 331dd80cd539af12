"""The TrainJob status reporter's decisions: when it reports, what ETA it gives, what a failure costs.

A clock and the transport are passed in (no sleeping, no network); tests/contract/test_trainer_status_endpoint.py
runs the same reporter against a real HTTPS server.
"""

from datetime import datetime, timezone

from eksflow.runtime.trainer_status import ENV_CA_CERT, ENV_TOKEN, ENV_URL, Endpoint, TrainerStatusReporter, reporter

ENDPOINT = Endpoint(
    "https://trainer.example:10443/apis/trainer.kubeflow.org/v1alpha1/namespaces/ml/trainjobs/j/status", "ca", "token"
)
OBSERVED = datetime(2026, 12, 7, 9, 0, 0, tzinfo=timezone.utc)


class Clock:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def inline(work):
    work()


def make(clock, sent, total=10, **options):
    def send(endpoint, body, timeout_s):
        sent.append(body["trainerStatus"])

    return TrainerStatusReporter(
        ENDPOINT, total, clock=clock, now=lambda: OBSERVED, send=send, **{"dispatch": inline, **options}
    )


def metric(status, name):
    return next(m["value"] for m in status["metrics"] if m["name"] == name)


def test_outside_a_trainjob_there_is_no_reporter(capsys):
    assert reporter(10, env={}) is None
    assert capsys.readouterr().err == ""


def test_a_partial_trainer_environment_is_one_line_and_no_reporter(capsys):
    assert reporter(10, env={ENV_URL: ENDPOINT.url, ENV_CA_CERT: "/ca.crt"}) is None
    assert reporter(10, env={ENV_URL: "http://plain:80/status", ENV_CA_CERT: "/ca.crt", ENV_TOKEN: "/t"}) is None
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2 and all(ENV_TOKEN in line and "not reported" in line for line in lines)


def test_the_trainers_environment_names_the_endpoint():
    env = {ENV_URL: ENDPOINT.url, ENV_CA_CERT: "/var/run/secrets/kubeflow/trainer/ca.crt", ENV_TOKEN: "/t/token"}
    found = reporter(10, env=env)
    assert found is not None
    assert found.endpoint == Endpoint(ENDPOINT.url, "/var/run/secrets/kubeflow/trainer/ca.crt", "/t/token")


def test_at_most_one_request_per_interval_and_the_last_step_at_once():
    clock, sent = Clock(), []
    status = make(clock, sent, min_interval_s=5.0)
    for step, at in [(0, 0.0), (1, 1.0), (2, 4.9), (3, 5.0), (4, 9.0), (10, 9.5)]:
        clock.now = at
        status.update(step, {})
    status.close()
    # 0 at once, 1 and 2 held back, 3 once 5 s passed, 4 held back, the last step at once, nothing more on close
    assert [metric(s, "step") for s in sent] == ["0", "3", "10"]


def test_the_state_held_back_is_sent_on_close():
    clock, sent = Clock(), []
    with make(clock, sent) as status:
        status.update(0, {})
        clock.now = 1.0
        status.update(1, {"loss": 2.5})
    assert [(metric(s, "step"), metric(s, "loss")) for s in sent[1:]] == [("1", "2.5")]


def test_progress_and_eta_from_the_steps_of_this_attempt():
    clock, sent = Clock(), []
    status = make(clock, sent, total=10, min_interval_s=0.0)
    clock.now = 100.0
    status.update(4, {})  # a resumed run: its first update is the ETA's origin
    clock.now = 120.0
    status.update(6, {"loss": 1.25, "learning_rate": 5e-05, "tokens_per_s": 812.5})
    clock.now = 125.0
    status.update(10, {"loss": 1.0})
    first, middle, last = sent
    assert (first["progressPercentage"], "estimatedRemainingSeconds" in first) == (40, False)
    assert (middle["progressPercentage"], middle["estimatedRemainingSeconds"]) == (60, 40)  # 10 s a step, 4 left
    assert [(m["name"], m["value"]) for m in middle["metrics"]] == [
        ("step", "6"),
        ("total_steps", "10"),
        ("loss", "1.25"),
        ("learning_rate", "5e-05"),
        ("tokens_per_s", "812.5"),
    ]
    assert (last["progressPercentage"], last["estimatedRemainingSeconds"]) == (100, 0)
    assert last["lastUpdatedTime"] == "2026-12-07T09:00:00Z"


def test_a_request_on_its_way_holds_no_step_and_the_newest_state_follows_it():
    clock, sent, pending = Clock(), [], []
    status = make(clock, sent, dispatch=pending.append)  # requests wait until the test runs them
    status.update(0, {})
    clock.now = 10.0
    status.update(1, {})  # due, but the first request is still on its way: not a second one beside it
    assert len(pending) == 1 and sent == []
    pending.pop()()
    status.close()
    assert [metric(s, "step") for s in sent] == ["0", "1"]


def test_failures_cost_one_line_then_at_most_one_a_minute(capsys):
    clock = Clock()

    def refused(endpoint, body, timeout_s):
        raise ConnectionRefusedError(111, "Connection refused")

    status = TrainerStatusReporter(ENDPOINT, 100, clock=clock, send=refused, dispatch=inline, min_interval_s=5.0)
    for step in range(13):  # a request every 5 s for 60 s
        clock.now = step * 5.0
        status.update(step, {"loss": 1.0})
    status.close()
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2
    assert "Connection refused" in lines[0] and "training goes on" in lines[0]
    assert "(12 requests failed since the last line)" in lines[1]  # at 60 s: the 12 since the first line
