"""The Slurm task against a real HTTP server on 127.0.0.1 playing slurmrestd: what it prints, which job it adopts.

The server answers every request with the body a test scripts, and records what it was asked. A slurmrestd (or a
proxy before it) may echo the request's token in an error: the task's line must never hold the token or any part
of it, nor a control character a terminal would act on.
"""

from __future__ import annotations

import json
import os
import signal
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from eksflow.runtime import slurm_job
from eksflow.runtime.slurm import slurm_api
from tests.unit.core.test_slurm_job import UID, own_argv

TOKEN = "JWT-SECRET-123"


@dataclass
class Slurmrestd:
    """What the server answers (status, content type, body) and the requests it saw (method, path, token)."""

    url: str
    answer: tuple[int, str, bytes] = (200, "application/json", b"{}")
    seen: list[tuple[str, str, str]] = field(default_factory=list)
    script: Callable[[str, str], tuple[int, str, bytes]] | None = None  # answers by (method, path) when set


@pytest.fixture
def server() -> Iterator[Slurmrestd]:
    state = Slurmrestd("")

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            state.seen.append((self.command, self.path, self.headers.get("X-SLURM-USER-TOKEN", "")))
            code, kind, body = state.script(self.command, self.path) if state.script else state.answer
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            self._answer()

        def do_POST(self) -> None:
            self._answer()

        def do_DELETE(self) -> None:
            self._answer()

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{httpd.server_port}"
    yield state
    httpd.shutdown()
    httpd.server_close()


def task(tmp_path, server: Slurmrestd, token_text: str, capsys) -> tuple[int, str]:
    """(exit code, stderr) of `python -m eksflow.runtime.slurm_job` in this process, the token file as given."""
    (tmp_path / "token").write_text(token_text)
    code = slurm_job.main([*own_argv(tmp_path, url=server.url), "--", "eksflow.llm.steps.train"])
    return code, capsys.readouterr().err


def errors_body(text: str) -> bytes:
    return json.dumps({"errors": [{"error_number": 1, "description": text}]}).encode()


ECHOED = f"rejected X-SLURM-USER-TOKEN: {TOKEN}\n\x1b[2Jforged line\x07"


@pytest.mark.parametrize(
    "answer",
    [
        (500, "text/plain", ECHOED.encode()),
        (500, "text/plain", ("x" * 290 + TOKEN + "y" * 50).encode()),  # the token across the shortening
        (401, "application/json", errors_body(ECHOED)),
        (200, "application/json", errors_body(ECHOED)),
    ],
    ids=["500-text", "500-text-long", "401-errors", "200-errors"],
)
def test_slurmrestd_echoing_the_token_is_one_line_without_it_or_its_controls(tmp_path, server, capsys, answer):
    server.answer = answer
    code, err = task(tmp_path, server, TOKEN + "\n", capsys)
    assert code == 1
    assert server.seen and server.seen[0][2] == TOKEN  # the request carried it: only the output must not
    assert len(err.strip().splitlines()) == 1 and err.startswith("slurm error: "), err
    assert TOKEN not in err and TOKEN[:8] not in err and "***" in err
    assert "\x1b" not in err and "\x07" not in err and "\r" not in err


@pytest.mark.parametrize(
    ("token_text", "problem"),
    [
        (f"{TOKEN}\nsecond-line\n", "holds a line break at position 14"),
        ("", "is empty"),
        ("  \n", "is empty"),
        (f"{TOKEN}\x1b[2J", "holds a control character at position 14"),
    ],
    ids=["line-break", "empty", "blank", "escape"],
)
def test_a_token_no_header_can_carry_is_refused_before_any_request(tmp_path, server, capsys, token_text, problem):
    code, err = task(tmp_path, server, token_text, capsys)
    assert code == 2 and server.seen == []
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"error: --token-file={tmp_path / 'token'}: the Slurm token {problem}"), err
    assert TOKEN not in err and "second-line" not in err and "\x1b" not in err


def job(version: str, job_id: int, *, name: str, user: str, comment: str, state: str = "RUNNING") -> dict[str, object]:
    """A job of GET /jobs as the version reports it."""
    return {
        "job_id": job_id,
        "name": name,
        "user_name": user,
        "comment": comment,
        "job_state": state if version == "v0.0.38" else [state],
        "restart_cnt": 0,
    }


@pytest.mark.parametrize("version", ["v0.0.38", "v0.0.44"])
def test_only_this_workflows_own_unended_job_of_the_token_user_is_adopted(tmp_path, server, version):
    name, ours = "llama-lora-x7k2-train", slurm_job.job_comment(UID)
    others = [
        job(version, 1, name=name, user="mallory", comment=ours),  # another user's, made to look like ours
        job(version, 2, name=name, user="root", comment=""),  # submitted by hand, or by an older eksflow
        job(version, 3, name=name, user="root", comment=slurm_job.job_comment(UID.replace("5f", "6f"))),
        job(version, 4, name=name, user="root", comment=ours, state="COMPLETED"),
        job(version, 5, name="llama-lora-x7k2-evaluate", user="root", comment=ours),
    ]
    api = slurm_api(version, server.url, user="root", token=TOKEN)
    a = slurm_job.JobArgs.from_argv(own_argv(tmp_path, user="root", job_name=name))
    server.answer = (200, "application/json", json.dumps({"jobs": others}).encode())
    assert slurm_job.adopted(api, a) is None
    mine = job(version, 6, name=name, user="root", comment=ours, state="PENDING")
    server.answer = (200, "application/json", json.dumps({"jobs": [*others, mine]}).encode())
    found = slurm_job.adopted(api, a)
    assert found is not None and (found.job_id, found.user, found.comment) == (6, "root", ours)


def test_a_stop_while_the_job_is_submitted_cancels_the_job_it_made(tmp_path, server, capsys):
    """SIGTERM lands while the submission is in flight: the task finds its own job by its comment and cancels it."""
    submitted: list[dict[str, object]] = []

    def slurmrestd(method: str, path: str) -> tuple[int, str, bytes]:
        if method == "POST":
            submitted.append(
                job("v0.0.38", 41, name="llama-lora-x7k2-train", user="root", comment=slurm_job.job_comment(UID))
            )
            os.kill(os.getpid(), signal.SIGTERM)  # the workflow is stopped before the task reads the job's id
            return 200, "application/json", b'{"job_id": 41}'
        return 200, "application/json", json.dumps({"jobs": submitted}).encode()

    def unhandled(signum: int, frame: object) -> None:
        pytest.fail("SIGTERM reached no handler of the task's: it would have died leaving its job running")

    server.script = slurmrestd
    before = signal.signal(signal.SIGTERM, unhandled)
    try:
        code, err = task(tmp_path, server, TOKEN, capsys)
    finally:
        signal.signal(signal.SIGTERM, before)
    assert code == 128 + signal.SIGTERM
    assert ("DELETE", "/slurm/v0.0.38/job/41", TOKEN) in server.seen, server.seen
    assert err.strip().splitlines()[-1] == "SIGTERM: cancelled Slurm job 41"


def test_slurmrestd_echoing_the_token_in_pieces_shows_no_piece_of_it(tmp_path, server, capsys):
    """An echo cut in two (`JWT-SEC...`, `RET-123`) holds no whole token, yet both pieces give most of it away."""
    server.answer = (401, "text/plain", b"bad token prefix JWT-SEC... suffix RET-123")
    code, err = task(tmp_path, server, TOKEN, capsys)
    assert code == 1 and len(err.strip().splitlines()) == 1, err
    assert "JWT-SEC" not in err and "RET-123" not in err
    assert "bad token prefix ***... suffix ***" in err


@pytest.mark.parametrize(
    ("version", "flag", "error"),
    [
        # what Slurm 22.05's slurmrestd answered here for a partition it has not (measured)
        ("v0.0.38", "partition", {"error_code": 2000, "error": "Invalid partition name specified"}),
        ("v0.0.44", "partition", {"error_number": 2000, "error": "Invalid partition name specified", "source": "x"}),
        ("v0.0.44", "qos", {"error_number": 2066, "error": "Invalid qos specification"}),
    ],
    ids=["partition-v0.0.38", "partition-v0.0.44", "qos-v0.0.44"],
)
def test_a_partition_or_qos_slurm_does_not_have_is_bad_input_in_one_line_naming_the_setting(
    tmp_path, server, capsys, version, flag, error
):
    """It was exit 1, and retried to the same refusal; no job was made, none is left."""
    refused = (500, "application/json", json.dumps({"errors": [error]}).encode())
    server.script = lambda method, path: refused if method == "POST" else (200, "application/json", b'{"jobs": []}')
    (tmp_path / "token").write_text(TOKEN)
    argv = own_argv(tmp_path, url=server.url, api_version=version, **{flag: "nosuch"})
    code = slurm_job.main([*argv, "--", "eksflow.llm.steps.train"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith(f"error: --{flag}=nosuch (cluster.slurm.{flag}): Slurm refused"), err
    assert error["error"] in err and "fix: " in err
