"""A rollout step's failure is recorded in the rollout state for the exit handler, by one decorator on every step."""

from __future__ import annotations

from pathlib import Path

import pytest

from eksflow.llm.steps import load_candidate, promote, serve_champion, shift_traffic
from eksflow.llm.steps.canary import step as canary_step
from eksflow.llm.steps.common import rollout, tracking
from eksflow.runtime.args import StepFailedError, StepInputError

ROLLOUT_STEPS = [serve_champion, load_candidate, canary_step, shift_traffic, promote]


def fleet(tmp_path: Path) -> dict[str, object]:
    """A rollout's FleetArgs whose state names a champion and no candidate yet."""
    state_file = tmp_path / "rollout" / "state.json"
    rollout.write_state(state_file, rollout.RolloutState(champion_version="1", champion_slot="blue"))
    return {
        "model_name": "m",
        "tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}",
        "vllm_url": "http://127.0.0.1:9",
        "proxy_url": "http://127.0.0.1:9",
        "serving_dir": tmp_path / "adapters",
        "routes_file": tmp_path / "routes.json",
        "state_file": state_file,
    }


@pytest.mark.parametrize("step", ROLLOUT_STEPS, ids=lambda m: m.__name__.removeprefix("eksflow.llm.steps."))
def test_every_rollout_step_runs_under_the_one_recorder(step):
    assert step.run.__wrapped__.__name__ == "run"  # rollout.records_failures, not a wrapper of its own
    assert step.run.__module__ == step.__name__


@pytest.mark.parametrize(
    ("step", "values", "recorded"),
    [(shift_traffic, {"percent": 50}, "shift-50"), (promote, {}, "promote")],
    ids=["shift", "promote"],
)
def test_a_failing_step_records_its_line_under_its_task_name_and_still_fails(tmp_path, step, values, recorded):
    args = step.Args.model_validate({**fleet(tmp_path), **values})
    with pytest.raises(StepInputError, match="names no candidate") as failed:
        step.run(args)
    assert rollout.read_state(args.state_file).failure == f"{recorded}: {failed.value}"


def test_the_recorded_line_is_cut_to_a_tag_value_and_a_success_records_nothing(tmp_path):
    args = shift_traffic.Args.model_validate({**fleet(tmp_path), "percent": 10})

    @rollout.records_failures("analyze")
    def fails(_: shift_traffic.Args) -> shift_traffic.Outputs:
        raise StepFailedError("x" * 10_000)

    @rollout.records_failures("analyze")
    def succeeds(_: shift_traffic.Args) -> shift_traffic.Outputs:
        return shift_traffic.Outputs(weights={})

    assert succeeds(args) == shift_traffic.Outputs(weights={})
    assert rollout.read_state(args.state_file).failure == ""
    with pytest.raises(StepFailedError):
        fails(args)
    assert rollout.read_state(args.state_file).failure == f"analyze: {'x' * 10_000}"[: tracking.MAX_TAG_CHARS]
