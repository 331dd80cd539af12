"""steps.serve (`make serve`): a key made once and kept 0600, shown in the curl line; --host checked (SE2)."""

import shlex
import stat

import pytest

from steps import serve


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
