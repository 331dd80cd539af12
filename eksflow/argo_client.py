"""One HTTP call to an Argo Server, or one line saying why it failed: the transport under `submit` and the verbs.

Connection settings follow the argo CLI: ARGO_SERVER (host:port), ARGO_TOKEN (sent verbatim as the Authorization
header; a bare token gets the `Bearer ` prefix), ARGO_NAMESPACE, ARGO_SECURE, ARGO_INSECURE_SKIP_VERIFY and
ARGO_BASE_HREF. A credential goes in ARGO_TOKEN only: a user, password or token inside ARGO_SERVER or
ARGO_BASE_HREF, and a token holding a control character, are refused (ArgoSettingError, bad input) without being
printed; every error line has the token and any other credential redacted (eksflow.runtime.shown). Every request
has a connect and a read timeout (EKSFLOW_ARGO_CONNECT_TIMEOUT and EKSFLOW_ARGO_READ_TIMEOUT, in seconds), so a
server that accepts the connection and never answers is an error, not a hang. An answer that is not the JSON the
API defines (a proxy's or SSO page's HTML, `{}`) is an error too.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import ssl
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import requests
from urllib3.exceptions import InsecureRequestWarning, ProtocolError, ReadTimeoutError

from eksflow.errors import EXIT_BAD_INPUT, EXIT_FAILED, EksflowError
from eksflow.runtime.shown import printable, redact, url_credential

CONNECT_TIMEOUT_S = 10.0  # a reachable server accepts in milliseconds; 10 s covers a cold port-forward
READ_TIMEOUT_S = 60.0  # the server's own calls to the Kubernetes API answer in seconds; a minute means it is stuck
EXPLAIN = {
    400: "the server refused the request as invalid",
    401: "the server refused the token; set ARGO_TOKEN to the output of `argo auth token` (or a service account token)",
    403: "the token's service account may not do this in this namespace; check its Role",
    404: "no such workflow, namespace or API path; check the name, ARGO_NAMESPACE and ARGO_BASE_HREF",
    409: "a workflow with this name already exists; submit again (generateName picks a new name) or delete it",
}


_TAG = re.compile(r"<[^>]*>")


class ArgoServerError(EksflowError):
    """A request the Argo Server refused or could not answer; the message is one line saying what to check."""

    label = "argo server error"
    exit_code = EXIT_FAILED


class ArgoSettingError(ArgoServerError):
    """Bad input, refused before any request: a connection setting (ARGO_SERVER, ARGO_TOKEN, ...), a run name."""

    label = "config error"
    exit_code = EXIT_BAD_INPUT


class StreamIdleError(ArgoServerError):
    """A streaming answer (a followed log) sent nothing for the read timeout; the caller may reconnect."""

    label = "idle stream"
    exit_code = EXIT_FAILED


@dataclass(frozen=True)
class ArgoServer:
    """Where and how to reach an Argo Server: the argo CLI's settings plus request timeouts."""

    url: str  # https://host:port/<base href>/, ending in "/"
    namespace: str = "argo"
    token: str = ""
    verify: bool = True  # False with ARGO_INSECURE_SKIP_VERIFY=true
    connect_timeout_s: float = CONNECT_TIMEOUT_S
    read_timeout_s: float = READ_TIMEOUT_S

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, *, namespace: str | None = None) -> ArgoServer:
        """The server the argo CLI would talk to with these environment variables (os.environ by default)."""
        env = os.environ if environ is None else environ
        return cls(
            url=server_url(
                env.get("ARGO_SERVER", ""),
                secure=env.get("ARGO_SECURE", "true") != "false",
                base_href=env.get("ARGO_BASE_HREF", ""),
            ),
            namespace=namespace or env.get("ARGO_NAMESPACE") or "argo",
            token=_token(env.get("ARGO_TOKEN", "")),
            verify=env.get("ARGO_INSECURE_SKIP_VERIFY") != "true",
            connect_timeout_s=_seconds(env, "EKSFLOW_ARGO_CONNECT_TIMEOUT", CONNECT_TIMEOUT_S),
            read_timeout_s=_seconds(env, "EKSFLOW_ARGO_READ_TIMEOUT", READ_TIMEOUT_S),
        )

    @classmethod
    def from_options(cls, options: argparse.Namespace, environ: Mapping[str, str] | None = None) -> ArgoServer:
        """The server named by the CLI's flags (--argo-server, -n, --secure, -k, --argo-base-href) over the env."""
        env = dict(os.environ if environ is None else environ)
        # each flag defaults to its environment variable, so a set flag simply wins
        if getattr(options, "argo_server", None):
            env["ARGO_SERVER"] = options.argo_server
        if getattr(options, "argo_base_href", None):
            env["ARGO_BASE_HREF"] = options.argo_base_href
        if getattr(options, "secure", None) is not None:
            env["ARGO_SECURE"] = "true" if options.secure else "false"
        if getattr(options, "insecure_skip_verify", False):
            env["ARGO_INSECURE_SKIP_VERIFY"] = "true"
        return cls.from_env(env, namespace=getattr(options, "namespace", None))

    def headers(self) -> dict[str, str]:
        """Accept JSON, and the token as the argo CLI sends it."""
        headers = {"Accept": "application/json"}
        token = self.token.strip()
        if token:
            headers["Authorization"] = token if " " in token else f"Bearer {token}"
        return headers

    def call(
        self,
        method: str,
        path: str,
        *,
        body: Mapping[str, Any] | None = None,
        params: Mapping[str, str] | None = None,
        session: requests.Session | None = None,
    ) -> Any:
        """Send one request to `api/v1/<path>` and return the decoded JSON answer, or raise ArgoServerError."""
        with self._errors(), self._response(method, path, body=body, params=params, session=session) as response:
            return self._decode(response)

    def stream(
        self, path: str, params: Mapping[str, str], *, session: requests.Session | None = None
    ) -> Iterator[dict[str, Any]]:
        """GET a streaming endpoint and yield each event's `result` object; an `error` event raises."""
        with self._errors(), self._response("GET", path, params=params, session=session, stream=True) as response:
            for raw in self._lines(response):
                line = raw.decode("utf-8", errors="replace").strip()
                if line.startswith("data:"):  # server-sent events; otherwise one JSON object per line
                    line = line[len("data:") :].strip()
                if not line or line.startswith((":", "event:", "id:", "retry:")):
                    continue
                try:
                    event = json.loads(line)
                except ValueError:
                    raise ArgoServerError(f"the log stream from {self.url} is not JSON ({_first_line(line)})") from None
                if not isinstance(event, dict):
                    raise ArgoServerError(f"the log stream from {self.url} sent {_first_line(line)}, not an event")
                if event.get("error"):
                    error = event["error"]
                    message = error.get("message", error) if isinstance(error, dict) else error
                    raise ArgoServerError(f"the log stream from {self.url} failed: {_first_line(str(message))}")
                if isinstance(event.get("result"), dict):
                    yield event["result"]

    def _lines(self, response: requests.Response) -> Iterator[bytes]:
        """The lines of a streamed body as they arrive (iter_lines would wait for 512 bytes: a log line is less)."""
        read1 = getattr(response.raw, "read1", None)  # urllib3 >= 2: whatever has arrived, at most amt bytes
        try:
            if read1 is None:
                yield from response.iter_lines(chunk_size=1)
                return
            pending = b""
            while chunk := read1(1 << 16, decode_content=True):
                *lines, pending = (pending + chunk).split(b"\n")
                yield from lines
            if pending:
                yield pending
        except (requests.exceptions.ConnectionError, ReadTimeoutError) as err:
            # requests wraps urllib3's read timeout in a ConnectionError; read1 raises urllib3's own
            if not isinstance(err, ReadTimeoutError) and "timed out" not in str(err).lower():
                raise
            raise StreamIdleError(f"the stream from {self.url} sent nothing for {self.read_timeout_s:g} s") from None
        except ProtocolError:
            raise ArgoServerError(f"the stream from {self.url} broke off; check the Argo Server's logs") from None

    @contextmanager
    def _response(
        self,
        method: str,
        path: str,
        *,
        body: Mapping[str, Any] | None = None,
        params: Mapping[str, str] | None = None,
        session: requests.Session | None = None,
        stream: bool = False,
    ) -> Iterator[requests.Response]:
        http = session or requests.Session()
        with warnings.catch_warnings():
            # the user chose --insecure-skip-verify; urllib3 would repeat a warning about it on every request
            warnings.simplefilter("ignore", InsecureRequestWarning)
            response = http.request(
                method,
                f"{self.url}api/v1/{path}",
                params=dict(params or {}),
                data=None if body is None else json.dumps(body),
                headers={**self.headers(), **({"Content-Type": "application/json"} if body is not None else {})},
                verify=self.verify,
                timeout=(self.connect_timeout_s, self.read_timeout_s),
                stream=stream,
            )
        try:
            if response.status_code != 200:
                response.raise_for_status()  # a 3xx that was not followed, 4xx, 5xx: _errors explains it
                raise ArgoServerError(
                    f"HTTP {response.status_code} from {self.url}: {_server_message(response)}; "
                    "the API answers 200 on success: check ARGO_SERVER and ARGO_BASE_HREF"
                )
            yield response
        finally:
            response.close()
            if session is None:
                http.close()

    @contextmanager
    def _errors(self) -> Iterator[None]:
        """Every failure of the request as one ArgoServerError line, the token redacted; never a traceback."""
        try:
            with self._explained():
                yield
        except ArgoServerError as err:  # a server may echo the Authorization header in its error body
            raise type(err)(redact(str(err), [self.token])) from None

    @contextmanager
    def _explained(self) -> Iterator[None]:
        try:
            yield
        except requests.exceptions.SSLError as err:
            raise ArgoServerError(
                f"TLS to {self.url} failed ({_reason(err)}); for a self-signed certificate use --insecure-skip-verify "
                "(ARGO_INSECURE_SKIP_VERIFY=true), for a plain-http server ARGO_SECURE=false"
            ) from None
        except requests.exceptions.ConnectTimeout:
            raise ArgoServerError(
                f"no connection to the Argo Server at {self.url} within {self.connect_timeout_s:g} s; "
                "check ARGO_SERVER and port-forwarding (EKSFLOW_ARGO_CONNECT_TIMEOUT sets the limit)"
            ) from None
        except (requests.exceptions.ReadTimeout, requests.exceptions.ChunkedEncodingError) as err:
            what = "did not answer" if isinstance(err, requests.exceptions.ReadTimeout) else "broke off its answer"
            raise ArgoServerError(
                f"the Argo Server at {self.url} accepted the connection but {what} within "
                f"{self.read_timeout_s:g} s; is ARGO_SERVER an Argo Server? (EKSFLOW_ARGO_READ_TIMEOUT sets the limit)"
            ) from None
        except requests.exceptions.ConnectionError as err:
            raise ArgoServerError(
                f"cannot reach the Argo Server at {self.url} ({_reason(err)}); check ARGO_SERVER and port-forwarding"
            ) from None
        except requests.exceptions.HTTPError as err:
            response = err.response
            code = response.status_code if response is not None else 0
            hint = EXPLAIN.get(code) or ("the Argo Server failed; retry, then check its logs" if code >= 500 else "")
            message = _server_message(response) if response is not None else str(err)
            raise ArgoServerError(f"HTTP {code} from {self.url}: {message}" + (f"; {hint}" if hint else "")) from None
        except requests.exceptions.RequestException as err:  # invalid URL, too many redirects, ...
            raise ArgoServerError(f"request to {self.url} failed: {_first_line(str(err))}") from None

    def _decode(self, response: requests.Response) -> Any:
        try:
            return response.json()
        except ValueError:
            kind = "HTML" if "html" in response.headers.get("Content-Type", "").lower() else "text"
            raise ArgoServerError(
                f"the server at {self.url} answered 200 with {kind}, not the API's JSON "
                f"({_first_line(response.text) or 'empty body'}): a proxy or SSO login page? check ARGO_SERVER, "
                "ARGO_BASE_HREF and ARGO_TOKEN"
            ) from None


def server_url(server: str, *, secure: bool, base_href: str = "") -> str:
    """`host:port` (as ARGO_SERVER holds it) -> `https://host:port/<base href>/`; a credential in either is refused."""
    if not server:
        raise ArgoSettingError("no Argo Server: set ARGO_SERVER=host:port or pass --argo-server")
    # a base href is a path: read as the path of a URL, its query is checked like the server's
    settings = {
        "ARGO_SERVER (--argo-server)": server if "://" in server else f"http://{server}",
        "ARGO_BASE_HREF (--argo-base-href)": f"http://argo/{base_href.lstrip('/')}",
    }
    for name, url in settings.items():
        if found := url_credential(url):
            raise ArgoSettingError(
                f"{name} holds a credential ({found}), which error lines and links would show; "
                'give the server as host:port and the token in ARGO_TOKEN (e.g. ARGO_TOKEN="$(argo auth token)")'
            )
    url = server if "://" in server else f"{'https' if secure else 'http'}://{server}"
    href = base_href.strip("/")
    return url.rstrip("/") + "/" + (f"{href}/" if href else "")


def workflow_object(answer: Any, url: str, what: str) -> dict[str, Any]:
    """`answer` if it is a Workflow (an object with metadata.name), else ArgoServerError naming what came back."""
    metadata = answer.get("metadata") if isinstance(answer, dict) else None
    if not isinstance(metadata, dict) or not isinstance(metadata.get("name"), str) or not metadata["name"]:
        raise ArgoServerError(
            f"the server at {url} answered {what} with {_first_line(json.dumps(answer))}, not a Workflow; "
            "is ARGO_SERVER an Argo Server (and ARGO_BASE_HREF its base path)?"
        )
    return dict(answer)


def _server_message(response: requests.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        text = response.text
        if "html" in response.headers.get("Content-Type", "").lower():
            text = " ".join(_TAG.sub(" ", text).split())  # a proxy's error page: its words, not its markup
        return _first_line(text) or response.reason or "no message"
    message = body.get("message") or body.get("error") or body if isinstance(body, dict) else body
    return _first_line(str(message))


def _first_line(text: str, limit: int = 200) -> str:
    """The first non-empty line of `text`, at most `limit` characters: server answers can be whole pages."""
    line = next((part.strip() for part in text.splitlines() if part.strip()), "")
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _reason(err: Exception) -> str:
    """The innermost cause of a requests/urllib3 error: `[Errno 111] Connection refused`, a certificate problem."""
    chain: list[BaseException] = [err]
    while chain[-1].__context__ is not None and chain[-1].__context__ not in chain:
        chain.append(chain[-1].__context__)
    verify = next((e for e in chain if isinstance(e, ssl.SSLCertVerificationError)), None)
    if verify is not None:
        return f"certificate verify failed: {verify.verify_message}"
    inner = chain[-1]
    text = str(getattr(inner, "reason", None) or inner)
    return _first_line(text.split(": ", 1)[-1] if text.startswith("<") else text, 160)


def _seconds(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ArgoSettingError(f"{name}={raw!r} is not a number of seconds, e.g. {name}={default:g}") from None
    if not 0 < value <= 3600:
        raise ArgoSettingError(f"{name}={raw!r} must be between 0 and 3600 seconds, e.g. {name}={default:g}")
    return value


def _token(raw: str) -> str:
    """ARGO_TOKEN without surrounding whitespace; refused, never echoed, when a control character is inside it."""
    token = raw.strip()
    if printable(token) != token:
        position = next(i for i, char in enumerate(token) if printable(char) != char)
        raise ArgoSettingError(
            f"ARGO_TOKEN holds a control character (a line break?) at position {position}, which no HTTP header "
            'can carry; set it to the token alone, e.g. ARGO_TOKEN="$(argo auth token)"'
        )
    return token
