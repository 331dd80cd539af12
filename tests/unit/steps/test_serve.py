"""eksflow.llm.steps.serve (`make serve`): a key made once and kept 0600, shown in the curl line; --host and the key's
place checked; `make serve`/`make rollback` pass MODEL as one argument."""

import os
import shlex
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from eksflow.llm.steps import serve
from eksflow.runtime.args import StepInputError

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(
    "host",
    ["127.0.0.1", "0.0.0.0", "::1", "fe80::1", "localhost", "serve-1.example.com", "1host", "a" * 63],
)
def test_ip_addresses_and_rfc1123_host_names_are_accepted(host):
    assert serve.Args(model_name="llama-lora", host=host).host == host


@pytest.mark.parametrize(
    "host",
    ["", "127.0.0.1 --api-key=x", "-h", "host_name", "a..b", "-lead.example", "trail-.example", "a" * 64,
     "exa$mple", "1.2.3.4/8", "host\n", "x." * 127 + "x"],
    ids=["empty", "argv-splice", "flag", "underscore", "empty-label", "lead-hyphen", "trail-hyphen", "long-label",
         "dollar", "cidr", "newline", "too-long"],
)  # fmt: skip
def test_a_bad_host_exits_2_with_one_line_before_anything_runs(tmp_path, capsys, host):
    db = f"sqlite:///{tmp_path}/registry/mlflow.db"
    argv = ["--model-name=llama-lora", f"--tracking-uri={db}", f"--serve-dir={tmp_path / 'serve'}", f"--host={host}"]
    assert serve.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "host" in err and "RFC 1123" in err, err
    assert list(tmp_path.iterdir()) == []  # no registry opened, no key made, no engine started


def test_the_key_is_made_once_kept_0600_reused_and_replaced_if_others_could_read_it(tmp_path):
    key = serve.api_key(tmp_path / "serve")
    path = tmp_path / "serve" / serve.KEY_FILE
    assert len(key) >= 40 and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert serve.api_key(tmp_path / "serve") == key  # a restart keeps the key clients were given
    path.chmod(0o644)  # readable by others: it may have leaked
    replaced = serve.api_key(tmp_path / "serve")
    assert replaced != key and stat.S_IMODE(path.stat().st_mode) == 0o600


def test_the_curl_line_sends_the_key():
    text = serve.usage("http://127.0.0.1:8000", "llama-lora", "k3y")
    curl = next(line.strip() for line in text.splitlines() if line.strip().startswith("curl "))
    words = shlex.split(curl)
    assert words[words.index("-H") + 1] == "Authorization: Bearer k3y"
    assert "http://127.0.0.1:8000/v1/chat/completions" in words


KEY_REFUSALS = {
    "folder": "is not a file (a folder?); remove it",
    "dangling-link": "is a symbolic link; the key is kept in a file of its own: remove the link",
    "link-to-a-file": "is a symbolic link; the key is kept in a file of its own: remove the link",
    "two-lines": "does not hold one key (a single line of letters, digits and -._~+/=",
    "a-space": "does not hold one key (a single line of letters, digits and -._~+/=",
}


@pytest.mark.parametrize("kind", KEY_REFUSALS)
def test_a_key_path_that_is_no_key_file_exits_2_in_one_line_before_the_registry_is_read(tmp_path, capsys, kind):
    """A link would make its target's content the key (printed in the curl line); a key must be one header token."""
    key = tmp_path / "serve" / serve.KEY_FILE
    key.parent.mkdir()
    linked = tmp_path / "someone-elses-secret"
    linked.write_text("the-linked-files-content\n")
    linked.chmod(0o600)
    if kind == "folder":
        key.mkdir()
    elif kind == "dangling-link":
        key.symlink_to(tmp_path / "gone")
    elif kind == "link-to-a-file":
        key.symlink_to(linked)
    else:
        key.write_text("first-line\nsecond-line\n" if kind == "two-lines" else "a key\n")
        key.chmod(0o600)
    argv = [
        "--model-name=llama-lora",
        f"--tracking-uri=sqlite:///{tmp_path}/none/mlflow.db",
        f"--serve-dir={key.parent}",
    ]
    assert serve.main(argv) == 2
    out, err = capsys.readouterr()
    assert len(err.strip().splitlines()) == 1 and err.startswith(f"error: --serve-dir: {key} {KEY_REFUSALS[kind]}")
    assert "the-linked-files-content" not in out + err and "second-line" not in out + err
    assert not (tmp_path / "none").exists()
    with pytest.raises(StepInputError):  # nothing else reads it either
        serve.api_key(key.parent)
    assert linked.read_text() == "the-linked-files-content\n"  # and the link's target is left as it was


@pytest.mark.parametrize("target", ["serve", "rollback"])
@pytest.mark.parametrize(
    "hostile",
    ["a b; touch {marker}", "x`touch {marker}`", "it's\"; touch {marker}"],
    ids=["command", "backquote", "quotes"],
)
def test_make_passes_a_hostile_model_as_one_argument_that_the_step_refuses_in_one_line(tmp_path, target, hostile):
    """`make serve MODEL=...`: the value reaches the step whole (no shell splitting or command), which refuses it."""
    marker = tmp_path / "ran"
    hostile = hostile.format(marker=marker)
    bin_dir = Path(sys.executable).parent  # this environment, whichever checkout runs the test
    done = subprocess.run(
        ["make", "--no-print-directory", "-o", "setup", "-o", ".venv/.eksflow-installed", target, f"BIN={bin_dir}",
         f"MODEL={hostile}", f"ARGS=--outputs-dir={tmp_path / 'out'}"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False, env=outside_make(),
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert not marker.exists()  # no command of the value ran
    step_lines = [line for line in done.stderr.splitlines() if not line.startswith("make:")]
    assert step_lines == [
        f"error: --model-name: String should match pattern '^[A-Za-z0-9][A-Za-z0-9._\\-]{{0,127}}$' (got {hostile!r})"
    ], done.stderr


def outside_make() -> dict[str, str]:
    """This environment without what a calling make adds (`make test` runs the tests): a user's own `make serve`."""
    return {k: v for k, v in os.environ.items() if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS", "MAKEOVERRIDES")}
