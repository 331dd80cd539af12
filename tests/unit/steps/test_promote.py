"""`champion` moves only by compare-and-set (RO4); `rollback` puts `previous` back. Real sqlite registry."""

import pytest

from eksflow.llm.steps import promote, rollback
from eksflow.llm.steps.common import tracking
from eksflow.runtime.args import StepFailedError

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
