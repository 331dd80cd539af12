"""eksflow.runtime.shown: the one redaction and the one control-character escaping every printing path uses."""

import pytest

from eksflow.runtime.shown import printable, redact, shown, url_credential, url_setting_problem

HOSTILE = {
    "osc8-link": "\x1b]8;;http://evil\x1b\\click\x1b]8;;\x1b\\",
    "clear-screen": "\x1b[2J",
    "bell": "\x07",
    "c1-csi": "\x9b31m",
    "bidi-override": "abc\u202efed",
    "bidi-isolate": "\u2066x\u2069",
    "carriage-return": "ok\rFAKE",
    "newline": "ok\n  train  Succeeded",
    "del": "a\x7fb",
}
RAW = [chr(c) for c in [*range(0x00, 0x09), *range(0x0A, 0x20), *range(0x7F, 0xA0)]] + [
    *map(chr, range(0x202A, 0x202F)),
    *map(chr, range(0x2066, 0x206A)),
]


@pytest.mark.parametrize("text", HOSTILE.values(), ids=HOSTILE.keys())
def test_printable_leaves_no_control_character(text):
    escaped = printable(text)
    assert not any(char in escaped for char in RAW)
    assert printable(escaped) == escaped  # idempotent: printing twice through it changes nothing more


def test_printable_keeps_text_and_tabs_and_names_each_escape():
    assert printable("épreuve\tü 日本") == "épreuve\tü 日本"
    assert printable("\x1b[2J\x9b\u202e\n") == "\\x1b[2J\\x9b\\u202e\\n"


@pytest.mark.parametrize(
    "text",
    [
        "HTTP 401: Authorization: Bearer s3cr3t-value was refused",
        "map[Authorization:[Bearer s3cr3t-value] Accept:[application/json]]",
        '{"authorization": "Bearer s3cr3t-value"}',
        "Authorization: s3cr3t-value",
        "header Basic czNjcjN0LXZhbHVl",
        "https://admin:s3cr3t-value@mlflow.example.com/api",
        "https://host/path?token=s3cr3t-value&page=2",
        "s3://bucket/key?X-Amz-Signature=s3cr3t-value&X-Amz-Credential=AKIA",
        "echo: s3cr3t-value",
    ],
)
def test_redact_hides_tokens_headers_userinfo_and_credential_queries(text):
    assert "s3cr3t-value" not in redact(text, ["s3cr3t-value"])
    assert "czNjcjN0LXZhbHVl" not in redact(text)


def test_redact_reads_the_secret_variables_and_keeps_ordinary_text(monkeypatch):
    monkeypatch.setenv("ARGO_TOKEN", "from-the-environment")
    assert redact("got from-the-environment back") == "got *** back"
    plain = "basic checks failed at https://host/runs?page=2 for user x@y"
    assert redact(plain) == plain


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("bad token prefix JWT-SEC... suffix RET-123", "bad token prefix ***... suffix ***"),
        ("JWT-SECRET-123 and SECRET again", "*** and *** again"),  # SECRET: 6 of its characters in a row
        ("ECRET-1 then T-123", "*** then T-123"),  # 5 characters in a row say too little to hide
        ("no part of it: JWT secret", "no part of it: JWT secret"),
    ],
)
def test_redact_hides_every_run_of_six_or_more_of_a_secrets_characters(text, expected):
    assert redact(text, ["JWT-SECRET-123"]) == expected


def test_redact_hides_a_short_secret_only_whole():
    assert redact("pin 4821 and 482", ["4821"]) == "pin *** and 482"


def test_shown_redacts_then_escapes():
    assert shown("Bearer abc.def\x1b[2J") == "Bearer ***\\x1b[2J"


@pytest.mark.parametrize(
    ("url", "found"),
    [
        ("https://user:password@host", "a user name or password before '@'"),
        ("https://token@host", "a user name or password before '@'"),
        ("https://host/x?access_token=1", "the query parameter 'access_token'"),
        ("s3://b/k?X-Amz-Signature=1", "the query parameter 'X-Amz-Signature'"),
        ("https://host/x?sig=1", "the query parameter 'sig'"),
        ("https://host/x?password=1", "the query parameter 'password'"),
        ("https://host/x?page=2", ""),
        ("sqlite:////fsx/mlflow/mlflow.db", ""),
        ("http://[", ""),
    ],
)
def test_url_credential(url, found):
    assert url_credential(url) == found


def test_a_url_setting_with_a_credential_names_the_supported_way_and_not_the_password():
    problem = url_setting_problem("mlflow.tracking_uri", "https://user:hunter22@mlflow")
    assert "MLFLOW_TRACKING_TOKEN" in problem and "hunter22" not in problem
    assert "IAM role" in url_setting_problem("data.source", "s3://b/k?X-Amz-Signature=1")
    assert url_setting_problem("data.source", "a text mentioning https://u:p@h") == ""  # only whole URLs
