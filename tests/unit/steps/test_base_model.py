"""Base-model folders in the shared cache: published whole, and converted or copied once however many tasks ask."""

import multiprocessing
import time
from pathlib import Path

from eksflow.llm.steps.common import base_model


def _publish_when_told(go, target: Path, fills: Path) -> None:
    def fill(tmp: Path) -> None:
        with open(fills, "a") as log:
            log.write("filled\n")
        time.sleep(0.5)  # a conversion takes long enough for the other task to arrive
        (tmp / base_model.MODEL_MARKER).write_text("{}")

    go.wait()
    base_model._publish(target, fill)


def test_tasks_starting_together_on_a_new_cache_convert_the_model_once(tmp_path):
    """validate-data and prepare-fleet start together on a new cache: one converts, the other waits for it."""
    target, fills = tmp_path / "models" / base_model.DEMO_MODEL, tmp_path / "fills"
    ctx = multiprocessing.get_context("fork")
    go = ctx.Event()
    tasks = [ctx.Process(target=_publish_when_told, args=(go, target, fills)) for _ in range(2)]
    for task in tasks:
        task.start()
    go.set()
    for task in tasks:
        task.join(30)
    assert [task.exitcode for task in tasks] == [0, 0]
    assert fills.read_text() == "filled\n"
    assert (target / base_model.MODEL_MARKER).is_file()
    assert sorted(p.name for p in target.parent.iterdir()) == [f".{target.name}.lock", target.name]  # no leftovers
