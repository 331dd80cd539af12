r"""What eksflow prints of text it did not write: secrets redacted, control characters escaped.

Every line eksflow prints that carries outside text (a server's answer, a run or node name, a node's message, a
log line, a step's error) goes through `shown`: `redact` hides tokens and credentials, `printable` escapes the
characters a terminal would act on (ESC and OSC sequences, the bell, C1 controls) or that reorder what it shows
(bidi overrides). `url_setting_problem` refuses a URL setting that carries a credential (`url_credential`).

    shown("HTTP 401: header was Bearer eyJhbGciOi...\x1b[2J")  ->  "HTTP 401: header was Bearer ***\\x1b[2J"
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Iterable
from urllib.parse import parse_qsl, urlsplit

# Environment variables holding credentials eksflow or its steps read; their values never appear in output.
SECRET_ENV = (
    "ARGO_TOKEN",
    "MLFLOW_TRACKING_TOKEN",
    "MLFLOW_TRACKING_PASSWORD",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "HF_TOKEN",
    "LITELLM_MASTER_KEY",
    "VLLM_API_KEY",
)
MIN_SECRET_CHARS = 4  # a shorter value is no credential, and hiding it would blank out ordinary words
# A run of this many of a secret's characters in a row is hidden wherever it stands: shorter pieces of a random token
# say little about it, and hiding them would blank out ordinary words that share a few letters with a secret.
FRAGMENT_CHARS = 6
HIDDEN = "***"

# C0 controls but tab, DEL, C1 controls (U+009B is a one-byte CSI), and the bidi embeddings, overrides and isolates
_UNPRINTABLE = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
# RFC 6750's b64token after Bearer; after Basic, base64 of user:password (8+ characters: "basic checks" stays)
_SCHEME_TOKEN = re.compile(r"(?i)\b(bearer\s+)[A-Za-z0-9._~+/-]+=*|\b(basic\s+)[A-Za-z0-9+/]{8,}=*")
_AUTHORIZATION = re.compile(
    r"(?i)\b((?:proxy-)?authorization[\"']?\s*[:=]\s*[\[\"']*)(?!(?:bearer|basic)\s)[^\s\"',;[\])}]+"
)
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s@?#]+@")
_QUERY_VALUE = re.compile(r"(?i)([?&;]([^=&\s#]+)=)([^&\s#\"']*)")
# query keys that carry credentials: OAuth tokens, passwords, API keys, S3/GCS presigned-URL signatures, Azure SAS
_CREDENTIAL_KEY = re.compile(r"(?i)token|secret|passw|pwd|signature|credential|api[-_]?key|^(sig|key|auth|code)$")


def shown(text: str, secrets: Iterable[str] = ()) -> str:
    """`text` as eksflow prints it: `redact`ed, then `printable`."""
    return printable(redact(text, secrets))


def printable(text: str) -> str:
    r"""`text` with each control character (tab aside) as an escape: `\x1b`, `\n`, `\x9b`, `\u202e`."""
    return _UNPRINTABLE.sub(_escape, text)


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """`text` with credentials replaced by `***`.

    Hidden: the values of `secrets` and of SECRET_ENV, and every run of FRAGMENT_CHARS or more of a value's
    characters in a row (a server that echoes a token in pieces, or cut short, shows no piece of it), `Bearer`/`Basic`
    and `Authorization:` values, the user and password of URLs, and credential query parameters (`?token=`,
    `X-Amz-Signature=`, ...).
    """
    values = {s.strip() for s in secrets} | {os.environ.get(name, "").strip() for name in SECRET_ENV}
    for value in sorted((v for v in values if len(v) >= MIN_SECRET_CHARS), key=len, reverse=True):
        text = _without_pieces(text, value)  # longest first: a value that contains another is hidden whole
    text = _SCHEME_TOKEN.sub(lambda m: (m.group(1) or m.group(2)) + HIDDEN, text)
    text = _AUTHORIZATION.sub(rf"\1{HIDDEN}", text)
    text = _USERINFO.sub(rf"\1{HIDDEN}@", text)
    return _QUERY_VALUE.sub(lambda m: m.group(1) + HIDDEN if _CREDENTIAL_KEY.search(m.group(2)) else m.group(0), text)


def _without_pieces(text: str, secret: str) -> str:
    """`text` with each run of FRAGMENT_CHARS or more characters found in `secret` (the whole of it, if shorter) hidden.

    Each window of FRAGMENT_CHARS characters that occurs in `secret` is covered; touching or overlapping windows make
    one hidden run, so `secret` itself, a prefix cut by `...` and a suffix each become one `***`.
    """
    if len(secret) < FRAGMENT_CHARS:
        return text.replace(secret, HIDDEN)
    windows = _windows(secret)
    runs: list[list[int]] = []  # [start, end) of each hidden run, in order
    for start in range(len(text) - FRAGMENT_CHARS + 1):
        if text[start : start + FRAGMENT_CHARS] in windows:
            if runs and start <= runs[-1][1]:
                runs[-1][1] = start + FRAGMENT_CHARS
            else:
                runs.append([start, start + FRAGMENT_CHARS])
    for start, end in reversed(runs):
        text = text[:start] + HIDDEN + text[end:]
    return text


@functools.lru_cache(maxsize=64)
def _windows(secret: str) -> frozenset[str]:
    """Every run of FRAGMENT_CHARS characters of `secret` (kept: the same secrets redact every line a run prints)."""
    return frozenset(secret[i : i + FRAGMENT_CHARS] for i in range(len(secret) - FRAGMENT_CHARS + 1))


def url_credential(url: str) -> str:
    """What credential `url` carries ("a user name or password", "the query parameter 'token'"), or ""."""
    try:
        parts = urlsplit(url)
    except ValueError:  # an unparsable URL carries nothing this can name; its own check refuses it
        return ""
    if parts.username is not None or parts.password is not None:
        return "a user name or password before '@'"
    keys = [key for key, _ in parse_qsl(parts.query, keep_blank_values=True) if _CREDENTIAL_KEY.search(key)]
    return f"the query parameter {printable(keys[0])!r}" if keys else ""


def url_setting_problem(key: str, value: str) -> str:
    """Why setting `key` may not hold `value` (a URL with a credential: argv and the Argo UI would show it), or ""."""
    if re.match(r"[A-Za-z][A-Za-z0-9+.-]*://", value) is None or not (found := url_credential(value)):
        return ""
    if "mlflow" in key or "tracking" in key:
        supported = (
            "give MLflow its credentials from a Kubernetes Secret as MLFLOW_TRACKING_TOKEN, or "
            "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD, in the steps' environment"
        )
    elif value.lower().startswith("s3://"):
        supported = "S3 access comes from the pods' IAM role (IRSA or Pod Identity), never the URL"
    else:
        supported = "pass credentials from a Kubernetes Secret in the environment, never in a setting"
    return (
        f"holds a credential ({found}); settings travel in plain text as workflow parameters and argv, which the "
        f"Argo UI shows: remove it from the URL; {supported}"
    )


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    if char == "\n":
        return "\\n"
    if char == "\r":
        return "\\r"
    return f"\\x{ord(char):02x}" if ord(char) <= 0xFF else f"\\u{ord(char):04x}"
