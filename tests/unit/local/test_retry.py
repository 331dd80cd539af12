"""retryStrategy decisions: policy, expression, backoff with cap, maxDuration counted from the first attempt."""

import importlib
import time

import pytest

from eksflow.local.model import Retry
from eksflow.local.phase import Phase
from eksflow.local.retry import Attempt, next_delay
from eksflow.local.substitution import Scope

SCOPE = Scope({"name": "wf"}, {"limit": "2"})


def retry(**fields: object) -> Retry:
    base = {"limit": 3, "policy": "OnFailure", "expression": None, "backoff_s": 1.0, "factor": 2.0}
    return Retry(**{**base, "max_duration_s": None, "cap_s": None, **fields})  # type: ignore[arg-type]


def failed(exit_code: int | None = 1, phase: Phase = Phase.FAILED, **extra: object) -> Attempt:
    return Attempt(phase, exit_code, f"exit code {exit_code}", 3.0, **extra)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("strategy", "attempt", "done", "expected"),
    [
        (retry(), failed(), 0, 1.0),
        (retry(), failed(), 2, 4.0),  # duration x factor^retries
        (retry(cap_s=3.0), failed(), 2, 3.0),
        (retry(), failed(), 3, None),  # the limit is reached
        (retry(policy="OnError"), failed(), 0, None),  # a non-zero exit is a failure, not an error
        (retry(policy="OnError"), failed(None, Phase.ERROR), 0, 1.0),
        (retry(policy="Always"), failed(None, Phase.ERROR), 0, 1.0),
        (retry(), failed(retriable=False), 0, None),  # the same inputs would fail the same way
        (None, failed(), 0, None),
    ],
    ids=["first", "backoff", "cap", "limit", "on-error-failed", "on-error-error", "always", "not-retriable", "none"],
)
def test_policy_limit_and_backoff(strategy: Retry | None, attempt: Attempt, done: int, expected: float | None) -> None:
    assert next_delay(strategy, done, attempt, time.monotonic(), SCOPE) == (expected, "")


def test_expression_decides_with_last_retry_variables_and_inputs() -> None:
    strategy = retry(
        expression="asInt(lastRetry.exitCode) != 2 && asInt(lastRetry.exitCode) != {{inputs.parameters.limit}}"
    )
    assert next_delay(strategy, 0, failed(1), time.monotonic(), SCOPE) == (1.0, "")
    delay, why = next_delay(strategy, 0, failed(2), time.monotonic(), SCOPE)
    assert delay is None and why.startswith("; not retried: 'asInt(lastRetry.exitCode) != 2")


def test_max_duration_counts_from_the_first_attempt() -> None:
    strategy = retry(max_duration_s=60.0)
    assert next_delay(strategy, 0, failed(), time.monotonic() - 30, SCOPE) == (1.0, "")
    delay, why = next_delay(strategy, 0, failed(), time.monotonic() - 3600, SCOPE)
    assert delay is None
    assert why == "; not retried: backoff.maxDuration=60s (counted from the first attempt's start) reached"


@pytest.mark.parametrize("pipeline", ["llama_lora", "lora_sweep", "champion_check"])
def test_every_rendered_retry_still_retries_a_step_that_fails_after_hours(pipeline: str) -> None:
    """A step preempted after hours of training is what retries exist for: no strategy may have run out of time."""
    from eksflow.config import config_type, load_config
    from eksflow.local.parse_templates import parse_retry
    from eksflow.render import manifest

    module = importlib.import_module(f"pipelines.{pipeline}")
    workflow = manifest(module.build(load_config(config_type(module.build), None, [])))
    strategies = {t["name"]: t["retryStrategy"] for t in workflow["spec"]["templates"] if t.get("retryStrategy")}
    assert strategies
    ten_hours_ago = time.monotonic() - 10 * 3600
    for name, raw in strategies.items():
        assert "maxDuration" not in (raw.get("backoff") or {}), name
        strategy = parse_retry(raw, name)
        if strategy is None or strategy.limit == 0:
            continue  # a task that must not repeat (an alert, a canary analysis)
        preempted = failed(143, Phase.FAILED if strategy.policy != "OnError" else Phase.ERROR)
        delay, why = next_delay(strategy, 0, preempted, ten_hours_ago, SCOPE)
        assert delay is not None and why == "", f"{name}: {why}"
        assert next_delay(strategy, 0, failed(2), ten_hours_ago, SCOPE)[0] is None or strategy.policy == "Always", name
