"""`logs` and `get` over a fanned-out task read naturally: every iteration's log and row, labelled by its item."""

import io
from pathlib import Path

from rich.console import Console

from eksflow.cli import parser
from eksflow.verbs import run_verb
from tests.unit.local.manifests import container, dag, inputs, run, task, workflow

SAY = "import sys; print('hello from', sys.argv[1])"


def fanned_out(tmp_path: Path) -> str:
    body = dag(
        "each",
        [task("train-nb", "say", arguments={"parameters": [{"name": "who", "value": "{{inputs.parameters.who}}"}]})],
        inputs=inputs("who"),
    )
    manifest = workflow(
        [
            task(
                "each",
                "each",
                arguments={"parameters": [{"name": "who", "value": "{{item}}"}]},
                withItems=["ada", "bo"],
            )
        ],
        [container("say", SAY, "{{inputs.parameters.who}}", inputs=inputs("who")), body],
    )
    result = run(manifest, tmp_path)
    assert result.phase == "Succeeded", result.message
    return result.name


def verb(tmp_path: Path, capsys, *argv: str) -> tuple[int, str]:
    args = parser("demo.py", "").parse_args([*argv, "--state-dir", str(tmp_path / "state")])
    code = run_verb(args, "demo", tmp_path, Console(file=io.StringIO()))
    return code, capsys.readouterr().out


def test_logs_of_a_fanned_out_task_prints_every_iteration_labelled(tmp_path, capsys):
    name = fanned_out(tmp_path)
    code, out = verb(tmp_path, capsys, "logs", name, "train-nb")
    assert code == 0
    said = [line for line in out.splitlines() if "hello from" in line]
    assert said == ["train-nb [each(0:ada)]: hello from ada", "train-nb [each(1:bo)]: hello from bo"]
    code, out = verb(tmp_path, capsys, "logs", name)  # the whole run: every log, none refused
    assert code == 0 and "train-nb [each(1:bo)]: hello from bo" in out


def test_get_labels_each_iteration_row_with_its_item(tmp_path, capsys):
    name = fanned_out(tmp_path)
    code, out = verb(tmp_path, capsys, "get", name)
    assert code == 0
    assert "  train-nb [each(0:ada)]  Succeeded" in out and "  train-nb [each(1:bo)]  Succeeded" in out
