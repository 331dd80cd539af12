"""No terminal escape reaches the terminal, and no rich markup is read, on any path eksflow prints outside text on.

Server answers (submit --watch, list, get, logs, an error line), a local run (its live table, its plain lines,
its final summary, `get`/`list`/`logs` of a planted status.json) and eksflow.llm.steps.alert each carry ESC sequences
(an OSC 8 link, clear-screen), the bell, a C1 CSI and a bidi override, and rich markup that must print literally.
"""

import io
import json
import re

import pytest
from rich.console import Console

from eksflow.cli import main
from eksflow.llm.steps import alert
from eksflow.local.display import TaskDisplay
from eksflow.local.phase import Phase
from eksflow.local.status import NodeStatus
from eksflow.run import execute
from pipelines.llama_lora import build
from tests.contract.fake_argo import Reply, start, workflow
from tests.unit.local.manifests import container, outputs, task
from tests.unit.local.manifests import workflow as local_workflow

HOSTILE = "A\x1b]8;;http://evil\x1b\\link\x1b]8;;\x1b\\ \x1b[2J\x07\x9b31m\u202eZ [bold red]loud[/bold red] [link=http://evil]x"
MARKUP = "[bold red]loud[/bold red] [link=http://evil]x"  # printed as these characters, not as style or link
# every character a terminal acts on: C0 but tab and newline (lines are split on those), DEL, C1, bidi controls
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
NAME = "llama-lora-x7k2p"


def assert_clean(text: str) -> None:
    assert not RAW.search(text), repr(RAW.search(text))
    assert "http://evil" in text  # the text itself is shown, escaped, not dropped


def cli(capsys, argv):
    with pytest.raises(SystemExit) as exit_info:
        main(build, argv)
    out, err = capsys.readouterr()
    return exit_info.value.code, out + err


@pytest.fixture
def server(monkeypatch):
    fake, stop = start()
    monkeypatch.setenv("ARGO_SERVER", fake.address)
    monkeypatch.setenv("ARGO_SECURE", "false")
    monkeypatch.setenv("EKSFLOW_ARGO_READ_TIMEOUT", "0.5")
    nodes = {
        f"{NAME}-1": {
            "id": f"{NAME}-1",
            "name": f"{NAME}.train",
            "displayName": f"train {HOSTILE}",
            "type": "Pod",
            "phase": f"Failed{HOSTILE}",
            "templateName": "train",
            "message": HOSTILE,
            "startedAt": "2026-05-01T10:00:05Z",
            "outputs": {"parameters": [{"name": "where", "value": HOSTILE}]},
        }
    }
    answer = workflow(NAME, "Failed", message=HOSTILE, nodes=nodes)
    fake.route("POST", "/api/v1/workflows/argo", Reply(200, workflow(NAME, "Running")))
    fake.route("GET", f"/api/v1/workflows/argo/{NAME}", Reply(200, answer))
    hostile_item = workflow(NAME, "Failed", message=HOSTILE)
    hostile_item["metadata"]["name"] = f"{NAME}{HOSTILE}"
    fake.route("GET", "/api/v1/workflows/argo", Reply(200, {"metadata": {}, "items": [hostile_item]}))
    line = json.dumps({"result": {"podName": "p", "content": HOSTILE}})
    fake.route("GET", f"/api/v1/workflows/argo/{NAME}/log", Reply(chunks=[f"{line}\n".encode()]))
    yield fake
    stop()


REMOTE = {
    "submit-watch": ["submit", "--watch"],
    "list": ["list"],
    "get": ["get", NAME],
    "logs": ["logs", NAME],
    "retry-error": ["retry", NAME],  # no route: the server's 404 answer is the error line
}


@pytest.mark.parametrize("argv", REMOTE.values(), ids=REMOTE.keys())
def test_server_answers_print_no_control_character_and_no_markup(server, capsys, argv):
    if argv[0] == "retry":
        server.route("PUT", f"/api/v1/workflows/argo/{NAME}/retry", Reply(500, {"message": HOSTILE}))
    _, printed = cli(capsys, argv)
    assert_clean(printed)
    assert MARKUP in printed


@pytest.fixture
def local_run(tmp_path, monkeypatch):
    """A failed local run whose step writes HOSTILE as its output, its log and its error (the node's message)."""
    monkeypatch.delenv("ARGO_SERVER", raising=False)
    code = (
        "import os, sys; os.makedirs(os.path.dirname(sys.argv[1]), exist_ok=True); open(sys.argv[1], 'w').write("
        "sys.argv[2]); print(sys.argv[2]); print(sys.argv[2], file=sys.stderr); sys.exit(3)"
    )
    template = container("train", code, "/tmp/outputs/where", HOSTILE, outputs=outputs("where"))
    manifest = local_workflow([task("train", "train")], [template])
    manifest["metadata"]["labels"] = {"eksflow.dev/pipeline": "llama-lora"}
    out = io.StringIO()
    assert execute(manifest, tmp_path / "state", None, Console(file=out, width=300), root=tmp_path) == 1
    return tmp_path / "state", out.getvalue()


def test_a_local_run_prints_its_steps_text_escaped(local_run):
    _, printed = local_run
    assert_clean(printed)  # plain phase lines, the failed task's log tail, the final summary with outputs
    assert MARKUP in printed


@pytest.mark.parametrize("argv", [["list"], ["get"], ["logs"], ["logs", "train"]], ids=["list", "get", "logs", "task"])
def test_local_verbs_print_a_planted_status_escaped(local_run, capsys, argv):
    state, _ = local_run
    (folder,) = (state / "runs").iterdir()
    status = folder / "status.json"
    document = json.loads(status.read_text())
    document["status"]["message"] = HOSTILE
    document["status"]["nodes"]["train"]["displayName"] = f"train {HOSTILE}"
    status.write_text(json.dumps(document))
    name_args = [] if argv == ["list"] else [folder.name]
    _, printed = cli(capsys, [argv[0], *name_args, *argv[1:], "--state-dir", str(state)])
    assert_clean(printed)
    assert "[bold red]loud" in printed


def test_the_live_table_shows_names_messages_and_progress_as_text():
    node = NodeStatus(
        name="train",
        display_name=f"train {HOSTILE}",
        template="train",
        phase=Phase.FAILED,
        message=HOSTILE,
        progress=HOSTILE,
    )
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=400, color_system="standard")
    display = TaskDisplay(console, lambda: [node])
    with display:
        pass
    printed = out.getvalue()
    for sequence in ("\x1b]8;;http://evil", "\x1b]8;id=", "\x1b[2J", "\x07", "\x9b", "\u202e"):
        assert sequence not in printed  # rich's own cursor and colour codes aside, nothing of the step's
    assert "[bold red]loud" in printed and "\\x1b[2J" in printed


def test_alert_prints_its_message_as_one_escaped_line(capsys):
    assert alert.main([f"--message={HOSTILE}\nsecond line", "--outputs-dir=/nonexistent"]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert_clean(err)
    assert MARKUP in err


def test_a_log_line_holding_the_token_prints_it_redacted(server, capsys, monkeypatch):
    token = "eyJhbGciOiJSUzI1NiJ9.c2VjcmV0.c2ln"
    monkeypatch.setenv("ARGO_TOKEN", token)
    line = json.dumps({"result": {"podName": "p", "content": f"debug: Authorization: Bearer {token}"}})
    server.route("GET", f"/api/v1/workflows/argo/{NAME}/log", Reply(chunks=[f"{line}\n".encode()]))
    _, printed = cli(capsys, ["logs", NAME])
    assert "debug: Authorization: Bearer ***" in printed
    assert token not in printed
