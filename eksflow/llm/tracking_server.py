"""The MLflow a pipeline names in `mlflow.tracking_uri`: the forms it takes, and whether its server answers.

    uri_problem("--flag=x")                  -> "is no MLflow tracking URI; give http(s)://host[:port][/path], ..."
    server_problem("http://127.0.0.1:9")     -> "MLflow at http://127.0.0.1:9 cannot be reached (connection refused)"

The forms are those MLflow reads that a step in a pod can use: an http(s) tracking server, a database (sqlite,
PostgreSQL, MySQL, SQL Server: SQLAlchemy URLs, a driver after `+` allowed), a `file:` store, or Databricks. A
credential in the URI is refused elsewhere (eksflow.runtime.shown.url_setting_problem), whatever the form.

`server_problem` is a local run's preflight (MlflowSettings.local_problems): a tracking server that does not answer
was found only after training, when evaluate failed against it. It asks the server's REST API what the steps will
ask of it, with the credentials MLflow's client takes from the environment: a search of the experiments (tracking)
and of the registered models (the registry). requests only: `render` and `plan` stay light.
"""

from __future__ import annotations

import os
import re
from urllib.parse import urlsplit

from eksflow.runtime.hosts import is_host

FORMS = (
    "http(s)://host[:port][/path], sqlite:////absolute/path.db, file:///absolute/folder, postgresql://host/db, "
    "or databricks"
)
DATABASES = ("sqlite", "postgresql", "mysql", "mssql")  # MLflow's SQLAlchemy stores
DATABRICKS = ("databricks", "databricks-uc")
SQLITE_FILE = re.compile(r"sqlite(\+\w+)?:///.+", re.IGNORECASE)
PREFLIGHT_TIMEOUT_S = 5.0  # per request: a server that answers at all answers a search of one item in well under it
QUESTIONS = (  # what the steps will ask (runs, then model versions): the REST API's GET forms, one item each
    ("an MLflow tracking server", "api/2.0/mlflow/experiments/search?max_results=1"),
    ("an MLflow server with a model registry", "api/2.0/mlflow/registered-models/search?max_results=1"),
)


def uri_problem(uri: str) -> str:
    """Why `uri` is no tracking URI MLflow can use from a step (empty, spaces, an unknown scheme, no host), or ""."""
    if not uri:
        return f"is empty; give {FORMS}"
    if not uri.isprintable() or any(c.isspace() for c in uri):
        return f"holds a space or control character; give {FORMS}"
    if uri in DATABRICKS:
        return ""
    try:
        parts = urlsplit(uri)
        port = parts.port
    except ValueError:  # a port beyond 65535 or not a number, an unbalanced IPv6 bracket
        return f"has no valid port (1-65535); give {FORMS}"
    scheme = parts.scheme.lower().split("+", 1)[0]
    if scheme in ("http", "https"):
        host = parts.hostname or ""
        if not is_host(host) or port == 0:
            return f"names no server (host {host!r}); give http(s)://host[:port][/path]"
        return ""
    if scheme == "sqlite":  # sqlite:// alone is a database in memory, gone with the step that opened it
        if not SQLITE_FILE.fullmatch(uri):
            return "names no database file; give sqlite:////absolute/path.db (sqlite:///relative.db: the step's folder)"
        return ""
    if scheme in DATABASES:
        return "" if parts.hostname else f"names no database server; give {scheme}://host[:port]/database"
    if scheme == "file":
        return "" if parts.path.startswith("/") else "names no absolute folder; give file:///absolute/folder"
    if scheme in DATABRICKS:
        return ""
    return f"is no MLflow tracking URI; give {FORMS}"


def server_problem(uri: str, timeout_s: float = PREFLIGHT_TIMEOUT_S) -> str:
    """Why the MLflow server at http(s) `uri` cannot take a run's tracking and registry, or "" when it can."""
    import requests

    token = os.environ.get("MLFLOW_TRACKING_TOKEN", "")
    user, password = os.environ.get("MLFLOW_TRACKING_USERNAME", ""), os.environ.get("MLFLOW_TRACKING_PASSWORD", "")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    insecure = os.environ.get("MLFLOW_TRACKING_INSECURE_TLS", "").lower() == "true"
    verify: bool | str = False if insecure else os.environ.get("MLFLOW_TRACKING_SERVER_CERT_PATH") or True
    for what, path in QUESTIONS:
        try:
            answer = requests.get(
                f"{uri.rstrip('/')}/{path}",
                headers=headers,
                auth=(user, password) if user and not token else None,
                timeout=timeout_s,
                verify=verify,
                allow_redirects=False,
            )
        except requests.Timeout:
            return f"MLflow at {uri} did not answer within {timeout_s:g} s; check that its server is up and reachable"
        except requests.RequestException as err:
            return f"MLflow at {uri} cannot be reached ({_reason(err)}); start its server or fix the URI"
        if answer.status_code in (401, 403):
            return (
                f"MLflow at {uri} refuses the request (HTTP {answer.status_code}); give its credentials as "
                "MLFLOW_TRACKING_TOKEN, or MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD"
            )
        if answer.status_code != 200:
            return f"{uri} answers HTTP {answer.status_code} to GET /{path.split('?')[0]}: give the address of {what}"
    return ""


def _reason(err: BaseException) -> str:
    """The operating system's words for a failed connection (`connection refused`), else the last error's own.

    requests wraps the socket's error in urllib3's (args, `reason`, the exception chain): the innermost OSError
    with an errno says what happened; failing that, the innermost error's message.
    """
    seen: set[int] = set()
    pending: list[object] = [err]
    innermost: BaseException = err
    while pending:
        current = pending.pop(0)
        if not isinstance(current, BaseException) or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno is not None and current.strerror:
            return current.strerror.lower()
        innermost = current
        pending += [*current.args, getattr(current, "reason", None), current.__cause__, current.__context__]
    found = re.search(r"\[Errno -?\d+\] ([^'\"()]+)", str(err))
    return found.group(1).strip().lower() if found else (str(innermost) or type(innermost).__name__)[:120]
